"""Phase 1 reads only the row groups of a raw segment that can hold rows of its time range
(issue 17): the previous hour's last segment is read for one sample gap of it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from fleetlens.pipeline import partitions
from fleetlens.pipeline.partitions import read_raw, row_groups_within
from fleetlens.pipeline.phases import _CATEGORICAL, _COLUMNS
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from tests.pipeline.rawdata import NS, T0, point, points_frame

ROWS_PER_GROUP = 10


def _segment(path: Path, times: list[int], *, statistics: bool = True) -> Path:
    """A metrics segment with rows at ``times``, in row groups of ten rows."""
    frame = points_frame([point("hw.power", ts, float(i), host=f"h{i % 3}", unit="W")
                          for i, ts in enumerate(times)])
    pq.write_table(frame.to_arrow(), path, row_group_size=ROWS_PER_GROUP,
                   write_statistics=statistics)
    return path


def _read(files: list[Path], lo: int, hi: int, within: bool) -> pl.DataFrame:
    return read_raw([str(f) for f in files], t.METRIC_POINTS,
                    pl.col(c.TS_NS).is_between(lo, hi, closed="left"), _COLUMNS["metrics"],
                    _CATEGORICAL["metrics"], within=(c.TS_NS, lo, hi) if within else None)


def test_row_groups_outside_the_range_are_skipped(tmp_path: Path) -> None:
    in_order = _segment(tmp_path / "a.parquet", [T0 + k * NS for k in range(50)])
    meta = pq.read_metadata(in_order)
    assert meta.num_row_groups == 5
    # rows 10..19 are seconds 10..19: only group 1 (and 2 for the row at second 20)
    assert row_groups_within(meta, c.TS_NS, T0 + 15 * NS, T0 + 21 * NS) == [1, 2]
    assert row_groups_within(meta, c.TS_NS, T0 + 50 * NS, T0 + 60 * NS) == []
    assert row_groups_within(meta, c.TS_NS, T0 - NS, T0 + 100 * NS) == [0, 1, 2, 3, 4]
    # no statistics, or no such column: every group may hold rows of the range
    bare = pq.read_metadata(_segment(tmp_path / "b.parquet", [T0 + k * NS for k in range(50)],
                                     statistics=False))
    assert row_groups_within(bare, c.TS_NS, T0 + 50 * NS, T0 + 60 * NS) == [0, 1, 2, 3, 4]
    assert row_groups_within(meta, "no_such_column", 0, 1) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("lo_s", "hi_s"), [(15, 21), (0, 50), (45, 200), (60, 70), (-5, 3)])
def test_reading_the_row_groups_within_gives_the_same_rows(tmp_path: Path, monkeypatch,
                                                           lo_s: int, hi_s: int) -> None:
    files = [
        _segment(tmp_path / "in_order.parquet", [T0 + k * NS for k in range(50)]),
        # out of order: every group spans the whole minute, none can be skipped
        _segment(tmp_path / "shuffled.parquet", [T0 + (k * 7 % 50) * NS for k in range(50)]),
        _segment(tmp_path / "bare.parquet", [T0 + k * NS for k in range(50)], statistics=False),
    ]
    read_groups: list[int] = []
    real = pq.ParquetFile.read_row_groups

    def counting(self, groups, *args, **kwargs):
        read_groups.extend(groups)
        return real(self, groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counting)
    lo, hi = T0 + lo_s * NS, T0 + hi_s * NS
    everything = _read(files, lo, hi, within=False)
    assert not read_groups
    assert_frame_equal(_read(files, lo, hi, within=True), everything)
    # a file with groups to skip is read by row group, the others whole
    within = [row_groups_within(pq.read_metadata(f), c.TS_NS, lo, hi) for f in files]
    assert read_groups == [g for groups in within if len(groups) < 5 for g in groups]
    assert len(within[0]) < 5 or (lo_s, hi_s) == (0, 50)  # the in-order file skips some
    assert len(within[2]) == 5  # no statistics: nothing skipped
    assert everything.height == 2 * len([k for k in range(50) if lo_s <= k < hi_s]) + len(
        [k for k in range(50) if lo_s <= k < hi_s])


def test_phase1_passes_its_time_range(monkeypatch) -> None:
    """phase1_hour reads metric points through read_raw with ``within`` set."""
    seen: list[tuple[str, int, int] | None] = []
    real = partitions.read_raw

    def spy(files, table, predicate, columns=None, categorical=(), within=None):
        seen.append(within)
        return real(files, table, predicate, columns, categorical, within)

    from fleetlens.pipeline import phases
    from fleetlens.pipeline.config import PipelineConfig

    monkeypatch.setattr(phases, "read_raw", spy)
    hour = T0
    phases.phase1_hour(PipelineConfig(), {"metrics": [], "spans": []}, hour)
    gap = int(PipelineConfig().max_sample_gap_s * NS)
    assert (c.TS_NS, hour - gap, hour + 3600 * NS) in seen


@pytest.mark.parametrize("read_rows", [1, 10, 25, 1000])
def test_a_big_segment_is_decoded_in_runs_of_row_groups(tmp_path: Path, monkeypatch,
                                                        read_rows: int) -> None:
    """A segment of more than ``_READ_ROWS`` rows is decoded a few row groups at a time (a
    shard keeps a small part of a segment holding every host's rows: decoding it whole held
    memory growing with the fleet), and the rows read are the same, in the same order."""
    files = [_segment(tmp_path / "a.parquet", [T0 + k * NS for k in range(50)]),
             _segment(tmp_path / "b.parquet", [T0 + (k * 7 % 50) * NS for k in range(50)])]
    lo, hi = T0 + 5 * NS, T0 + 45 * NS
    whole = _read(files, lo, hi, within=False)
    runs: list[list[int]] = []
    real = pq.ParquetFile.read_row_groups

    def counting(self, groups, *args, **kwargs):
        runs.append(list(groups))
        return real(self, groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counting)
    monkeypatch.setattr(partitions, "_READ_ROWS", read_rows)
    monkeypatch.setattr(partitions, "_BATCH_ROWS", 20)  # several casts and filters too
    for within in (False, True):
        runs.clear()
        assert_frame_equal(_read(files, lo, hi, within=within), whole)
        assert all(len(run) * ROWS_PER_GROUP <= max(read_rows, ROWS_PER_GROUP)
                   for run in runs)
        if read_rows < 50:
            assert runs and sorted(g for run in runs for g in run) == sorted(
                g for f in files
                for g in (row_groups_within(pq.read_metadata(f), c.TS_NS, lo, hi)
                          if within else range(5)))
        else:
            assert not runs or within  # whole files, unless groups are skipped


def test_row_group_runs(tmp_path: Path) -> None:
    meta = pq.read_metadata(_segment(tmp_path / "a.parquet", [T0 + k * NS for k in range(50)]))
    assert partitions.row_group_runs(meta, None, 50) is None  # small enough: one read
    assert partitions.row_group_runs(meta, None, 20) == [[0, 1], [2, 3], [4]]
    assert partitions.row_group_runs(meta, None, 5) == [[0], [1], [2], [3], [4]]
    assert partitions.row_group_runs(meta, [1, 2, 4], 20) == [[1, 2], [4]]
    assert partitions.row_group_runs(meta, [], 20) == []
