"""The reduce's bounded merge (pipeline/rangemerge.py): pieces sorted by a key, staged or in
memory, merged a range at a time into the bytes one frame publishes, holding one range."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fleetlens.pipeline.partitions import PARQUET, ROW_GROUP_ROWS, publish_staged
from fleetlens.pipeline.rangemerge import (
    STAGED_ROW_GROUP,
    Staged,
    range_bounds,
    range_filters,
    sink_sorted,
    sorted_ranges,
    stage,
)
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic

KEY = ["request_id", "trace_id"]


def _frame(n: int, seed: int = 1) -> pl.DataFrame:
    """Random rows, some request ids null and some repeated (told apart by the trace)."""
    rng = np.random.default_rng(seed)
    ids = [f"cmpl-{x:012x}" for x in rng.integers(0, 2**40, n)]
    ids[:5] = [None] * 5
    ids[10:14] = [ids[20]] * 4
    return pl.DataFrame({"request_id": ids, "trace_id": [f"{i:032x}" for i in range(n)],
                         "energy_j": rng.random(n)})


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def rows() -> pl.DataFrame:
    return _frame(3 * ROW_GROUP_ROWS // 2)  # two row groups in the partition


@pytest.mark.parametrize(("pieces", "budget", "staged"), [
    (1, 10**9, False), (4, 50_000, True), (7, 3 * STAGED_ROW_GROUP, True), (3, 40_000, False)])
def test_a_merge_in_ranges_writes_the_bytes_of_one_frame(tmp_path: Path, rows, pieces, budget,
                                                          staged) -> None:
    whole = tmp_path / "whole.parquet"
    write_parquet_atomic(rows.sort(KEY), whole, **PARQUET)
    parts = [rows.filter(pl.int_range(pl.len()) % pieces == i).sort(KEY)
             for i in range(pieces)]
    given = [stage(p, tmp_path / f"piece-{i}.parquet") if staged else p
             for i, p in enumerate(parts)]
    ranges = list(sorted_ranges(given, KEY, budget))
    if budget < rows.height:  # really cut: each range about the budget, none far above
        assert len(ranges) >= rows.height // budget
        assert max(r.height for r in ranges) < budget + pieces * STAGED_ROW_GROUP
    assert sum(r.height for r in ranges) == rows.height
    out = sink_sorted(iter(ranges), tmp_path / "part.parquet", **PARQUET)
    assert out.rows == rows.height and out.path.name.startswith(".")
    assert _digest(out.path) == _digest(whole)


def test_the_first_range_takes_the_nulls_and_ranges_do_not_overlap(rows) -> None:
    ordered = rows.sort(KEY)
    bounds = range_bounds([ordered], "request_id", 20_000)
    assert bounds == sorted(set(bounds)) and len(bounds) >= 5
    counts = [ordered.filter(f).height for f in range_filters("request_id", bounds)]
    assert sum(counts) == rows.height
    assert ordered.filter(range_filters("request_id", bounds)[0]).get_column(
        "request_id").null_count() == 5
    assert range_bounds([ordered], "request_id", rows.height) == []  # fits: one range


def test_a_repeated_key_is_never_cut(tmp_path: Path) -> None:
    """Rows sharing the range column's value stay in one range, so sorting each range by the
    whole key gives the global order."""
    frame = pl.DataFrame({"request_id": ["a"] * 50 + ["b"] * 50 + ["c"] * 50,
                          "trace_id": [f"{i:04x}" for i in range(150)]})
    pieces = [stage(frame.filter(pl.int_range(pl.len()) % 2 == i).sort(KEY),
                    tmp_path / f"{i}.parquet", row_group_size=10) for i in range(2)]
    ranges = list(sorted_ranges(pieces, KEY, 20))
    assert len(ranges) > 1
    assert pl.concat(ranges).equals(frame.sort(KEY))
    for r in ranges:
        assert r.get_column("request_id").n_unique() == r.height // 50 or r.height == 0


def test_a_staged_partition_is_renamed_into_place(tmp_path: Path, rows) -> None:
    dd = DataDir(tmp_path / "data")
    hour = 1_790_000_000 * 10**9 // (3600 * 10**9) * 3600 * 10**9
    from fleetlens.pipeline.partitions import partition_file, publish

    target = partition_file(dd, "request_energy", hour)
    staged = sink_sorted(iter([rows.sort(KEY)]), target, **PARQUET)
    assert not target.exists()  # written beside it, under a hidden name, until renamed
    assert publish_staged(dd, "request_energy", hour, staged) == rows.height
    assert target.exists() and not staged.path.exists()
    renamed = _digest(target)
    publish(dd, "request_energy", hour, rows.sort(KEY))
    assert _digest(target) == renamed
    # an empty one removes the partition, as publishing an empty frame does
    assert publish_staged(dd, "request_energy", hour, Staged(target.with_name(".x.tmp"), 0)) == 0
    assert not target.exists()


def test_a_staged_file_not_beside_its_partition_is_refused(tmp_path: Path, rows) -> None:
    dd = DataDir(tmp_path / "data")
    elsewhere = sink_sorted(iter([rows]), tmp_path / "x" / "part.parquet", **PARQUET)
    with pytest.raises(ValueError, match="not beside"):
        publish_staged(dd, "request_energy", 0, elsewhere)


def test_a_failed_merge_leaves_no_file(tmp_path: Path, rows) -> None:
    def broken():
        yield rows.head(10)
        raise RuntimeError("a shard's piece vanished")

    with pytest.raises(RuntimeError, match="vanished"):
        sink_sorted(broken(), tmp_path / "part.parquet", **PARQUET)
    assert list(tmp_path.iterdir()) == []
