"""The data directory on S3-compatible object storage (``s3://bucket/prefix``), against a real
S3 endpoint (moto's server on 127.0.0.1): the storage layer, conditional state writes, the job
lease, readers that lose a listed object, and collector -> store -> pipeline -> analytics ->
``fleetlens sql`` and the dashboard's queries, equal to the same data in a local directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from fleetlens.pipeline import joblock, lease
from fleetlens.pipeline.partitions import existing_hours, publish, read_hours, read_raw
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.state import PipelineState, StateError
from fleetlens.pipeline.storage import (
    DataDir,
    connect,
    is_vanished_file,
    parquet_files,
    retry_vanished,
    scan,
    unreadable_files,
    write_parquet_atomic,
)
from tests.s3 import S3Server, s3_server  # noqa: F401 - the fixture `s3`

NS = 1_000_000_000
HOUR = 3600 * NS
T0 = (time.time_ns() // HOUR - 2) * HOUR


def _spans(n: int, start: int = T0, host: str = "gpu-01") -> pl.DataFrame:
    spec = t.table(t.SPANS)
    frame = pl.DataFrame({c.TRACE_ID: [f"{i:032x}" for i in range(n)],
                          c.SPAN_ID: [f"{i:016x}" for i in range(n)],
                          c.START_NS: [start + i * NS for i in range(n)],
                          c.END_NS: [start + i * NS + NS // 2 for i in range(n)],
                          c.HOST_NAME: [host] * n})
    return frame.select(pl.col(k).cast(spec.columns[k]) for k in frame.columns)


def _url(server: S3Server, prefix: str = "fleet") -> str:
    return f"s3://{server.bucket()}/{prefix}"


def test_a_local_data_dir_loads_no_object_store_library(tmp_path: Path) -> None:
    code = (
        "import sys, polars as pl\n"
        "from fleetlens.pipeline.storage import DataDir, write_parquet_atomic, connect, scan\n"
        "from fleetlens.pipeline.state import PipelineState\n"
        "from fleetlens.pipeline import joblock\n"
        "import fleetlens.collector.sink\n"
        f"dd = DataDir({str(tmp_path / 'data')!r})\n"
        "write_parquet_atomic(pl.DataFrame({'a': [1]}), dd.raw('spans') / 'x.parquet')\n"
        "with joblock.exclusive(dd, 'test'):\n"
        "    PipelineState.load(dd).save(dd)\n"
        "connect(dd).sql('select count(*) from spans').fetchall(); scan(dd, 'spans').collect()\n"
        "bad = [m for m in ('obstore', 's3fs', 'botocore', 'aiobotocore', 'fsspec') "
        "if m in sys.modules]\n"
        "assert not bad, bad\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_publish_list_scan_and_query_an_s3_data_dir(s3: S3Server) -> None:
    dd = DataDir(_url(s3))
    assert dd.remote and str(dd.root).startswith("s3://") and not dd.wal.is_relative_to("/s3:")
    dd.require()  # an empty prefix of an existing bucket is a new data directory
    first = dd.raw_segment_path("spans", T0, "w1", 0)
    second = dd.raw_segment_path("spans", T0 + HOUR, "w1", 1)
    write_parquet_atomic(_spans(3), first)
    write_parquet_atomic(_spans(2, T0 + HOUR), second)
    listed = list(parquet_files(dd.raw("spans")))
    assert [str(p) for p in listed] == [str(first), str(second)]
    assert all(p.stat().st_size > 0 for p in listed)
    assert str(first.relative_to(dd.root)).startswith("raw/spans/date=")
    assert scan(dd, t.SPANS).collect().height == 5
    con = connect(dd)
    assert con.sql(f"select count(*) from {t.SPANS}").fetchall() == [(5,)]
    assert con.sql(f"select count(*) from {t.REQUESTS}").fetchall() == [(0,)]  # no data yet
    # the sandbox of `fleetlens sql` reads the views, and nothing else of the bucket
    sandbox = connect(dd, read_only_sandbox=True)
    assert sandbox.sql(f"select count(*) from {t.SPANS}").fetchall() == [(5,)]
    with pytest.raises(Exception, match="disabled by configuration|Permission"):
        sandbox.sql(f"select * from read_parquet('{dd.root.parent}/other/*.parquet')")
    # derived partitions: published, read back, removed when empty
    publish(dd, t.REQUESTS, T0, pl.DataFrame({c.REQUEST_ID: ["a", "b"]}))
    assert existing_hours(dd, t.REQUESTS) == [T0]
    assert read_hours(dd, t.REQUESTS, [T0, T0 + HOUR], columns=[c.REQUEST_ID]).height == 2
    publish(dd, t.REQUESTS, T0, pl.DataFrame({c.REQUEST_ID: []}, schema={c.REQUEST_ID: pl.String}))
    assert existing_hours(dd, t.REQUESTS) == []


def test_an_s3_data_dir_survives_pickling(s3: S3Server) -> None:
    """Ray tasks get the DataDir pickled (pipeline --runner ray): it must travel as its URL,
    not as a client with locks and sockets, and reopen the bucket on the other side."""
    import pickle

    dd = DataDir(_url(s3))
    write_parquet_atomic(_spans(2), dd.raw_segment_path("spans", T0, "w", 0))
    copy = pickle.loads(pickle.dumps(dd))
    assert copy.root == dd.root and copy.wal == dd.wal and copy.remote
    assert scan(copy, t.SPANS).collect().height == 2


def test_a_missing_bucket_is_a_clear_error(s3: S3Server) -> None:
    from fleetlens.pipeline.storage import StorageError

    with pytest.raises(StorageError, match="cannot read the data directory s3://no-such-bkt"):
        DataDir("s3://no-such-bkt/x").require()
    with pytest.raises(StorageError, match="names no bucket"):
        DataDir("s3:///x")


def test_credentials_and_endpoint_come_from_the_aws_files(s3: S3Server, tmp_path: Path) -> None:
    url = _url(s3)
    write_parquet_atomic(_spans(3), DataDir(url).raw_segment_path("spans", T0, "w", 0))
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n"
        "[bench]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    (tmp_path / "config").write_text(
        f"[profile bench]\nregion = us-east-1\nendpoint_url = {s3.endpoint}\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "FLEETLENS_"))}
    env.update(HOME=str(tmp_path), AWS_PROFILE="bench",
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "credentials"),
               AWS_CONFIG_FILE=str(tmp_path / "config"))
    out = subprocess.run([sys.executable, "-m", "fleetlens", "sql", "--data-dir", url,
                          "--format", "csv", f"select count(*) as n from {t.SPANS}"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["n", "3"]


def test_conditional_state_writes_lose_no_update_when_two_writers_race(s3: S3Server) -> None:
    dd = DataDir(_url(s3))
    # A stale writer is refused, and the newer state stays as it was.
    first, stale = PipelineState.load(dd), PipelineState.load(dd)
    first.watermarks["a"] = 1
    first.save(dd)
    stale.watermarks["b"] = 2
    with pytest.raises(StateError, match="replaced by another job"):
        stale.save(dd)
    assert PipelineState.load(dd).watermarks == {"a": 1}

    # Two writers add keys as fast as they can, each retrying on a refused save.
    refused = [0, 0]

    def writer(who: int) -> None:
        for k in range(12):
            while True:
                state = PipelineState.load(dd)
                state.watermarks[f"w{who}-{k}"] = k
                try:
                    state.save(dd)
                    break
                except StateError:
                    refused[who] += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = PipelineState.load(dd).watermarks
    assert final == {"a": 1, **{f"w{w}-{k}": k for w in (0, 1) for k in range(12)}}


def test_a_fresh_state_replaces_the_one_this_process_last_saw(s3: S3Server) -> None:
    dd = DataDir(_url(s3))
    PipelineState(fingerprint="one").save(dd)  # never loaded: replaces what is there
    PipelineState(fingerprint="two").save(dd)  # --full / a new fingerprint, as the runner does
    assert PipelineState.load(dd).fingerprint == "two"


def test_the_job_lease_excludes_renews_and_expires(s3: S3Server,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lease.ENV_LEASE_S, "1.5")
    dd = DataDir(_url(s3))
    path = joblock.lock_path(dd)
    events: list[str] = []
    holding = threading.Event()

    def first() -> None:
        with joblock.exclusive(dd, "pipeline"):
            holding.set()
            time.sleep(3.5)  # longer than the lease: only renewals keep it
            events.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(30)
    assert joblock.holder(dd).endswith("pipeline")
    waited: list[str] = []
    # another process's view: a fresh acquire (the in-process lock is re-entrant per thread)
    taken = lease.acquire(path, "compact", waited.append, ttl_s=1.5, poll_s=0.1)
    events.append("second took it")
    thread.join()
    assert events == ["first done", "second took it"]
    assert waited and "pipeline" in waited[0]
    taken.release()
    assert lease.is_released(lease.read(path)[0]) and joblock.holder(dd) == ""
    # A dead holder's lease (never renewed) is taken over once it has expired.
    stale = {"holder": "1 pipeline", "host": "gone", "token": "x",
             "expires_unix": time.time() + 0.5}
    path.write_bytes(json.dumps(stale).encode())
    start = time.monotonic()
    took = lease.acquire(path, "compact", None, ttl_s=5, poll_s=0.1)
    assert time.monotonic() - start >= 0.3  # it waited for the expiry, not less
    assert lease.read(path)[0]["token"] == took.token
    took.release()


@pytest.mark.parametrize("expires", [float("nan"), 1e308, "soon"])
def test_a_lease_that_would_never_expire_is_taken_over(s3: S3Server, expires: object) -> None:
    """Issue 33: NaN compares false and 1e308 never comes; a waiter waited for good."""
    path = joblock.lock_path(DataDir(_url(s3)))
    path.write_bytes(json.dumps({"holder": "1 pipeline", "token": "x",
                                 "expires_unix": expires}).encode())
    taken: list[lease.Lease] = []
    waiter = threading.Thread(target=lambda: taken.append(
        lease.acquire(path, "compact", None, ttl_s=5, poll_s=0.1)), daemon=True)
    waiter.start()
    waiter.join(20)
    assert taken, f"still waiting on a lease expiring at {expires!r}"
    assert lease.read(path)[0]["token"] == taken[0].token
    taken[0].release()


def test_readers_tolerate_an_object_listed_then_deleted(s3: S3Server) -> None:
    dd = DataDir(_url(s3))
    paths = [dd.raw_segment_path("spans", T0, "w", i) for i in range(3)]
    for i, path in enumerate(paths):
        write_parquet_atomic(_spans(2, T0 + i * 10 * NS), path)
    listed = [str(p) for p in parquet_files(dd.raw("spans"))]
    paths[1].unlink()  # compaction or retention, between the listing and the read
    with pytest.raises(Exception) as lost:
        read_raw(listed, t.SPANS, pl.lit(True))
    assert is_vanished_file(lost.value)
    with pytest.raises(Exception) as lost_dict:
        read_raw(listed, t.SPANS, pl.lit(True), categorical=(c.HOST_NAME,))
    assert is_vanished_file(lost_dict.value)
    # listing again (what retry_vanished's callers do) reads what is left
    rows = retry_vanished(lambda: scan(dd, t.SPANS).collect())
    assert rows.height == 4
    # the damaged-file check and the partition reader skip a vanished object
    assert unreadable_files(dd.raw("spans")) == []
    publish(dd, t.REQUESTS, T0, pl.DataFrame({c.REQUEST_ID: ["a"]}))
    hours = existing_hours(dd, t.REQUESTS)
    publish(dd, t.REQUESTS, T0, pl.DataFrame({c.REQUEST_ID: []}, schema={c.REQUEST_ID: pl.String}))
    assert read_hours(dd, t.REQUESTS, hours).height == 0


def test_compaction_and_retention_on_an_s3_data_dir(s3: S3Server) -> None:
    from fleetlens.pipeline.compact import compact
    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.runner import OUTPUTS, Pipeline
    from tests.pipeline.fleet import make_fleet, write_batches
    from tests.pipeline.rawdata import HOUR_NS
    from tests.pipeline.rawdata import T0 as FLEET_T0

    dd = DataDir(_url(s3))
    write_batches(dd, make_fleet(seed=3, seconds=400))
    job = Pipeline(dd, PipelineConfig())
    job.run_once()

    def outputs() -> dict[str, bytes]:
        return {str(p.relative_to(dd.root)): p.read_bytes()
                for table in OUTPUTS for p in parquet_files(dd.derived(table))}

    before_files = len(list(parquet_files(dd.root / "raw")))
    rows = connect(dd).sql(f"select count(*) from {t.SPANS}").fetchall()
    before = outputs()
    summary = compact(dd, PipelineConfig(), now_ns=FLEET_T0 + 10 * HOUR_NS)
    assert summary.merged_files == before_files and summary.written_files == 2
    assert len(list(parquet_files(dd.root / "raw"))) == 2  # one object per signal and hour
    assert connect(dd).sql(f"select count(*) from {t.SPANS}").fetchall() == rows
    assert job.run_once().dirty_hours == 0  # the state learned the merged objects
    assert job.run_once(full=True).new_segments == 2
    assert outputs() == before
    cfg = PipelineConfig(raw_retention_days=1, windows_retention_days=3)
    expired = compact(dd, cfg, now_ns=FLEET_T0 + 2 * 24 * HOUR_NS + 2 * HOUR_NS)
    assert expired.expired_raw_hours == 2
    assert list(parquet_files(dd.root / "raw")) == []
    assert connect(dd).sql(f"select count(*) from {t.WINDOWS}").fetchall()[0][0] > 0
    assert not list(parquet_files(dd.state / "energy-groups"))  # expired with the raw data


def test_late_points_keep_the_clean_hosts_on_an_s3_data_dir(s3: S3Server,
                                                            tmp_path: Path) -> None:
    """Late points of one host on S3: phase 1 and 2 keep every other host (the hour's energy
    partial saved as an object and read back), and the objects are a local full run's."""
    from dataclasses import replace

    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.runner import OUTPUTS, Pipeline
    from tests.pipeline.fleet import Fleet, make_fleet, write_batches
    from tests.pipeline.rawdata import points_frame, write_raw

    fleet = make_fleet(seed=5, hosts=4, seconds=300, rps=1.0)
    cfg = replace(PipelineConfig(), lateness_s=3600)
    local, dd = DataDir(tmp_path / "full"), DataDir(_url(s3, "late"))
    write_batches(local, fleet)
    Pipeline(local, cfg).run_once(full=True)
    last = len(fleet.point_batches) - 1
    held = [p for p in fleet.point_batches[last] if p[c.HOST_NAME] == "h1"]
    write_batches(dd, Fleet(fleet.span_batches, [*fleet.point_batches[:last], [
        p for p in fleet.point_batches[last] if p not in held]], fleet.distinct_requests))
    job = Pipeline(dd, cfg)
    job.run_once()
    assert list(parquet_files(dd.state / "energy-groups"))
    write_raw(dd, t.METRIC_POINTS, points_frame(held), writer="late", seq=9)
    summary = job.run_once()
    assert summary.kept_host_hours_phase2 >= 3 * summary.dirty_hours > 0

    def outputs(root: DataDir) -> dict[str, bytes]:
        return {str(p.relative_to(root.root)): p.read_bytes()
                for table in OUTPUTS for p in parquet_files(root.derived(table))}

    assert outputs(dd) == outputs(local)


def test_a_duckdb_read_that_loses_an_object_after_listing_it_is_retried(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB lists the objects of a view, then opens them through s3fs: an object deleted in
    between (compaction, retention) fails the read with s3fs's FileNotFoundError inside a
    DuckDB error, which readers must take for a vanished file and list again."""
    dd = DataDir(_url(s3))
    kept, lost = (dd.raw_segment_path("spans", T0, "w", i) for i in range(2))
    write_parquet_atomic(_spans(2), kept)
    write_parquet_atomic(_spans(3, T0 + 10 * NS), lost)
    fs = dd.root.bucket.filesystem()  # the filesystem connect() registers with DuckDB
    opened = fs._open

    def open_after_a_delete(path: str, *args: object, **kwargs: object) -> object:
        if path.endswith(lost.name) and lost.is_file():
            lost.unlink()  # listed by the glob, gone before it is opened
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(fs, "_open", open_after_a_delete)
    rows = retry_vanished(
        lambda: connect(dd).sql(f"select count(*) from {t.SPANS}").fetchall())
    assert rows == [(2,)] and not lost.is_file()

