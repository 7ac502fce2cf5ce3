from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import (
    MAX_COMPONENT,
    DataDir,
    StorageError,
    connect,
    existing_tables,
    parquet_files,
    remove_stale_tmp,
    safe_component,
    scan,
    tables_named_in,
    write_parquet_atomic,
)

HOSTILE = ["../x", "..", ".", "", "a/../../b", "/etc/passwd", "x\x00y", "\x00", "a" * 10_000,
           "héllo wörld", "🚀/..", "C:\\windows", "%2e%2e", "~root", "a\nb", "\udcff"]


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_partition_values_stay_inside(data_dir: DataDir, value: str) -> None:
    path = data_dir.partition_path(t.WINDOWS, host_name=value, date="2026-01-01")
    assert data_dir.root in path.parents
    assert path.parent.parent == data_dir.derived(t.WINDOWS)
    component = path.parent.name.partition("=")[2]
    assert "/" not in component and "\x00" not in component and component not in ("", ".", "..")
    assert len(component) <= MAX_COMPONENT
    path.mkdir(parents=True)  # the OS accepts the name
    assert path.is_dir()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_safe_component_is_safe_and_injective(value: str) -> None:
    escaped = safe_component(value)
    assert "/" not in escaped and "\x00" not in escaped and escaped not in (".", "..", "")
    assert len(escaped) <= MAX_COMPONENT
    other = value + "x"
    assert safe_component(other) != escaped


def test_raw_segment_path_is_partitioned_by_utc_hour(data_dir: DataDir) -> None:
    ts = 1_700_000_000 * 10**9  # 2023-11-14 22:13:20 UTC
    path = data_dir.raw_segment_path("spans", ts, "w../1", 7)
    assert path.relative_to(data_dir.root).as_posix() == (
        "raw/spans/date=2023-11-14/hour=22/w..%2F1-000000000007.parquet")
    with pytest.raises(StorageError, match="unknown raw signal"):
        data_dir.raw("traces")


def test_inside_rejects_escapes(data_dir: DataDir) -> None:
    with pytest.raises(StorageError, match="escapes"):
        data_dir.inside(data_dir.root / ".." / "elsewhere")


def test_atomic_write_publishes_whole_files(data_dir: DataDir) -> None:
    frame = pl.DataFrame({c.TRACE_ID: ["ab"] * 3, c.SPAN_ID: ["cd", "ef", "01"]})
    path = data_dir.raw_segment_path("spans", 0, "w1", 1)
    write_parquet_atomic(frame, path)
    assert pl.read_parquet(path).equals(frame)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_failed_write_leaves_nothing(data_dir: DataDir, monkeypatch) -> None:
    path = data_dir.raw_segment_path("spans", 0, "w1", 1)

    def boom(*args, **kwargs):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_parquet_atomic(pl.DataFrame({"x": [1]}), path)
    assert list(path.parent.iterdir()) == []


def test_connect_has_a_view_per_table_even_when_empty(data_dir: DataDir) -> None:
    con = connect(data_dir)
    assert con.sql("select count(*) from spans").fetchall() == [(0,)]
    assert existing_tables(data_dir) == []
    frame = t.table(t.CAUSES).empty().vstack(pl.DataFrame(
        {c.INCIDENT_ID: ["i1"], c.RANK: [1], c.CAUSE: ["slow_gpu"], c.SUBJECT: ["host_name=h1"],
         c.SCORE: [0.9], c.SHARE_OF_EXCESS: [0.8], c.EVIDENCE: ["{}"], c.SUMMARY: ["s"]}))
    write_parquet_atomic(frame, data_dir.partition_path(t.CAUSES, date="2026-01-01") / "a.parquet")
    con = connect(data_dir)
    rows = con.sql("select cause, cast(date as varchar) from causes").fetchall()
    assert rows == [("slow_gpu", "2026-01-01")]
    assert existing_tables(data_dir) == [t.CAUSES]
    assert scan(data_dir, t.CAUSES).collect().height == 1
    assert scan(data_dir, t.REQUESTS).collect().height == 0


def test_a_connection_for_one_query_makes_views_of_the_tables_it_names(
        data_dir: DataDir) -> None:
    query = 'select count(*) from "CAUSES" c join incidents i using (incident_id)'
    assert tables_named_in(query) == [t.INCIDENTS, t.CAUSES]
    assert tables_named_in("select requests from windows_old, spans_x") == [t.REQUESTS]
    frame = t.table(t.CAUSES).empty()
    write_parquet_atomic(frame, data_dir.partition_path(t.CAUSES, date="2026-01-01") / "a.parquet")
    con = connect(data_dir, tables=tables_named_in(query))
    assert con.sql(query).fetchall() == [(0,)]
    made = {row[0] for row in con.sql("select table_name from information_schema.tables")
            .fetchall()}
    assert made == {t.INCIDENTS, t.CAUSES}  # no view over the raw tables' thousands of files


def test_sandboxed_connection_refuses_file_access(data_dir: DataDir, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    con = connect(data_dir, read_only_sandbox=True)
    with pytest.raises(duckdb.Error):
        con.sql(f"select * from read_csv('{secret}')").fetchall()
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")


WRITER = textwrap.dedent("""
    import sys, numpy as np, polars as pl
    from fleetlens.pipeline.storage import write_parquet_atomic
    out = sys.argv[1]
    rng = np.random.default_rng(0)
    i = 0
    while True:
        frame = pl.DataFrame({"x": rng.random(400_000), "y": rng.integers(0, 9, 400_000)})
        write_parquet_atomic(frame, f"{out}/part-{i:05d}.parquet")
        print(i, flush=True)
        i += 1
""")


@pytest.mark.slow
def test_killed_writer_never_leaves_a_visible_partial_file(tmp_path: Path) -> None:
    """SIGKILL a writer mid-write, many times: readers never see a torn file."""
    out = tmp_path / "parts"
    out.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    kills = 0
    for attempt in range(6):
        proc = subprocess.Popen([sys.executable, str(script), str(out)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # at least one file published this round
        time.sleep(0.05 + 0.07 * attempt)  # land the kill at different points of a write
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        kills += 1
        files = list(parquet_files(out))
        assert files, "the writer published nothing"
        con = duckdb.connect()
        # A torn file would break the whole glob ("No magic bytes").
        total = con.sql(f"select count(*) from read_parquet('{out}/*.parquet')").fetchall()[0][0]
        assert total == 400_000 * len(files)
    leftovers = [p for p in out.iterdir() if p.name.startswith(".")]
    assert remove_stale_tmp(out) == len(leftovers)
    assert kills == 6
