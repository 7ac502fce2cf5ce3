"""Incremental runs recompute only the dirty hosts' shards (pipeline/dirtyhosts.py): late
metric points from a few hosts reopen an hour, the other hosts' rows are kept from the
published partitions, and the files are the bytes a full run over all the data writes."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from fleetlens.pipeline import phase2, phase2kept, phases
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.dirtyhosts import phase1_kept
from fleetlens.pipeline.discovery import Discovered
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.state import PipelineState, Segment
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.pipeline.fleet import GATEWAYS, Fleet, make_fleet, with_gateways, write_batches
from tests.pipeline.rawdata import points_frame, spans_frame, write_raw

HOSTS = 9
#: Late data arrives within the lateness (the default 300 s would call part of it too late).
CFG = replace(PipelineConfig(), lateness_s=3600)


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return with_gateways(make_fleet(seed=11, hosts=HOSTS, seconds=600, rps=1.5), HOSTS)


def _files(root: Path) -> dict[str, str]:
    dd = DataDir(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in OUTPUTS for p in parquet_files(dd.derived(table))}


@pytest.fixture(scope="module")
def full(tmp_path_factory, fleet) -> dict[str, str]:
    root = tmp_path_factory.mktemp("full") / "data"
    write_batches(DataDir(root), fleet)
    Pipeline(DataDir(root), CFG).run_once(full=True)
    return _files(root)


def _held_back(fleet: Fleet, late_hosts: set[str], late_spans: bool,
               batches: list[int] | None = None):
    """The fleet without the points of ``late_hosts`` in the point ``batches`` (default: the
    last) and, if ``late_spans``, the last batch's spans of those hosts, and a function
    writing what was held back as late segments."""
    last = len(fleet.point_batches) - 1
    spans = fleet.span_batches[last]
    batches = [last] if batches is None else batches

    def late_point(index: int, point: dict) -> bool:
        return index in batches and point[c.HOST_NAME] in late_hosts
    held_points = [p for i, batch in enumerate(fleet.point_batches) for p in batch
                   if late_point(i, p)]
    held_spans = [s for s in spans if late_spans and s[c.HOST_NAME] in late_hosts]
    early = Fleet([*fleet.span_batches[:last], [s for s in spans if s not in held_spans]],
                  [[p for p in batch if not late_point(i, p)]
                   for i, batch in enumerate(fleet.point_batches)],
                  fleet.distinct_requests)

    def late(dd: DataDir) -> None:
        write_raw(dd, t.METRIC_POINTS, points_frame(held_points), writer="late", seq=9)
        if held_spans:
            write_raw(dd, t.SPANS, spans_frame(held_spans), writer="late", seq=9)
    return early, late


def _died(*_args) -> None:
    raise RuntimeError("killed before saving the state")


def _late_run(root: Path, fleet: Fleet, cfg: PipelineConfig, late_hosts: set[str],
              late_spans: bool, monkeypatch, die_saving: bool = False,
              batches: list[int] | None = None) -> tuple[object, set[str], set[str]]:
    """Publish the fleet with the last batch's points of ``late_hosts`` (and, if
    ``late_spans``, its spans of those hosts) held back, run, publish what was held back
    as a late segment and run again (``die_saving``: a run dies first, one hour's energy
    partial not saved); return the run's summary and the hosts its point halves and its
    phase-2 shards recomputed."""
    dd = DataDir(root)
    early, late = _held_back(fleet, late_hosts, late_spans, batches)
    write_batches(dd, early)
    Pipeline(dd, cfg).run_once()
    late(dd)
    if die_saving:  # the run that reads the late data dies before saving the state
        real_save = phase2kept.save_groups

        def save_some(dd_, hour, body):  # the first hour's partial is not saved
            real_save(dd_, hour, body if seen else None)
            seen.add(hour)
        seen: set[int] = set()
        with monkeypatch.context() as patched:
            patched.setattr(phase2kept, "save_groups", save_some)
            patched.setattr(PipelineState, "save", _died)
            with pytest.raises(RuntimeError, match="killed"):
                Pipeline(dd, cfg).run_once()
        assert phase2kept.pending_hours(dd)
    recomputed: set[str] = set()
    real = phases.phase1_points

    def spy(*args, **kwargs):
        half = real(*args, **kwargs)
        recomputed.update(half.mapping.get_column(c.HOST_NAME).drop_nulls().to_list())
        for _name, piece in half.tables:
            frame = piece if isinstance(piece, pl.DataFrame) else pl.read_parquet(piece.path)
            if c.HOST_NAME in frame.columns:
                recomputed.update(frame.get_column(c.HOST_NAME).drop_nulls().to_list())
        return half

    monkeypatch.setattr(phases, "phase1_points", spy)
    recomputed2: set[str] = set()
    computed = phase2._computed

    def spy2(*args, **kwargs):
        part = computed(*args, **kwargs)
        for frame in (part.own.gpu_window_energy, part.own.windows, part.engine, part.energy):
            recomputed2.update(frame.get_column(c.HOST_NAME).drop_nulls().to_list())
        return part

    monkeypatch.setattr(phase2, "_computed", spy2)
    real_rows = phase2kept.published_rows
    read_back: list[tuple[str, int]] = []

    def spy_rows(dd_, table, hour, *args):
        read_back.append((table, hour))
        return real_rows(dd_, table, hour, *args)

    monkeypatch.setattr(phase2kept, "published_rows", spy_rows)
    summary = Pipeline(dd, cfg).run_once()
    # every kept host's published rows are read back once per table and hour, not per shard
    assert len(read_back) == len(set(read_back))
    assert bool(read_back) == (summary.kept_host_hours_phase2 > 0)
    return summary, recomputed, recomputed2


@pytest.mark.parametrize("per_shard", [1, 2, HOSTS + len(GATEWAYS)])
def test_late_points_of_two_hosts_recompute_only_theirs(tmp_path: Path, fleet, full,
                                                        per_shard, monkeypatch) -> None:
    """h3 and h7 (no instance mapping of their own) send their last points late: only their
    points are recomputed, the requests are not rewritten, and the files are the full run's
    (one shard, several shards staged and merged a range at a time)."""
    cfg = replace(CFG, hosts_per_shard=per_shard, reduce_rows=400, split_from_shards=2)
    summary, recomputed, recomputed2 = _late_run(tmp_path / "data", fleet, cfg, {"h3", "h7"},
                                                 False, monkeypatch)
    assert recomputed == {"h3", "h7"}
    assert summary.kept_host_hours >= HOSTS + len(GATEWAYS) - 2
    assert t.REQUESTS not in summary.rows_written  # no new span, the mapping unchanged
    # phase 2 too: energy and windows of the two hosts recomputed, every other host's kept
    assert recomputed2 == {"h3", "h7"}
    assert summary.kept_host_hours_phase2 >= summary.dirty_hours * (HOSTS + len(GATEWAYS) - 2)
    assert _files(tmp_path / "data") == full


def test_a_run_after_one_that_died_keeps_no_host_in_its_hours(tmp_path: Path, fleet, full,
                                                             monkeypatch) -> None:
    """The run that reads h3's late points dies after publishing its partitions, one hour's
    energy partial not saved: the next run keeps no host in the hours the dead run
    listed (it may have rewritten some of an hour's partitions and not the others), and the
    files are the full run's."""
    cfg = replace(CFG, hosts_per_shard=2)
    summary, _, recomputed2 = _late_run(tmp_path / "data", fleet, cfg, {"h3"}, False,
                                        monkeypatch, die_saving=True)
    assert summary.kept_host_hours_phase2 == 0 and len(recomputed2) > HOSTS - 2
    assert not phase2kept.pending_hours(DataDir(tmp_path / "data"))
    assert _files(tmp_path / "data") == full


def test_the_pipeline_command_says_how_many_host_hours_it_kept(tmp_path: Path, fleet,
                                                              full) -> None:
    """``fleetlens pipeline`` after h3's late points: it says how many host-hours each phase
    kept, and the files are the full run's."""
    from click.testing import CliRunner

    from fleetlens.cli import cli

    dd = DataDir(tmp_path / "data")
    config = tmp_path / "fleetlens.toml"
    config.write_text("[pipeline]\nlateness_s = 3600\n")
    early, late = _held_back(fleet, {"h3"}, False)
    write_batches(dd, early)
    base = ["pipeline", "--data-dir", str(dd.root), "--config", str(config), "--no-progress",
            "--no-analyze"]
    runner = CliRunner()
    assert runner.invoke(cli, base).exit_code == 0
    late(dd)
    out = runner.invoke(cli, base)
    assert out.exit_code == 0, out.output
    kept = re.search(r"not recomputed: (\d+) of points, (\d+) of energy and windows",
                     out.output)
    assert kept and int(kept[1]) > 0 and int(kept[2]) > 0, out.output
    assert _files(dd.root) == full


def test_late_points_that_move_only_the_mappings_times_keep_the_requests(
        tmp_path: Path, fleet, full, monkeypatch) -> None:
    """h0's points of the third batch come late (after the fourth), its instance -> GPU
    mapping points among them: they move the mapping's times, not the model of any
    instance, so the requests (which read only the models) are kept, and phase 2 keeps
    every other host."""
    cfg = replace(CFG, hosts_per_shard=2)
    summary, recomputed, recomputed2 = _late_run(tmp_path / "data", fleet, cfg, {"h0"}, False,
                                                 monkeypatch, batches=[2])
    assert recomputed == recomputed2 == {"h0"}
    assert t.REQUESTS not in summary.rows_written
    assert summary.kept_host_hours_phase2 >= summary.dirty_hours * (HOSTS + len(GATEWAYS) - 1)
    assert _files(tmp_path / "data") == full


def test_late_points_that_change_the_mapping_recompute_the_requests(tmp_path: Path, fleet,
                                                                    full,
                                                                    monkeypatch) -> None:
    """Every point of h0 comes late, its engine's model labels with them: the requests (a
    request's model may come from them) are recomputed too, the other hosts' points still
    kept; phase 2 recomputes the hosts owning requests of h0's instance ids (h0 alone
    here), and the files are the full run's."""
    cfg = replace(CFG, hosts_per_shard=2)
    summary, recomputed, recomputed2 = _late_run(tmp_path / "data", fleet, cfg, {"h0"}, False,
                                                 monkeypatch,
                                                 batches=list(range(len(fleet.point_batches))))
    assert recomputed == recomputed2 == {"h0"}
    assert summary.kept_host_hours > 0 and summary.rows_written.get(t.REQUESTS, 0) > 0
    assert summary.kept_host_hours_phase2 >= summary.dirty_hours * (HOSTS + len(GATEWAYS) - 1)
    assert _files(tmp_path / "data") == full


def test_late_spans_recompute_the_requests(tmp_path: Path, fleet, full, monkeypatch) -> None:
    """h5 sends its last points and spans late: its points and the hour's requests are
    recomputed."""
    cfg = replace(CFG, hosts_per_shard=3, split_from_shards=2)
    summary, recomputed, _ = _late_run(tmp_path / "data", fleet, cfg, {"h5"}, True,
                                       monkeypatch)
    assert recomputed == {"h5"}
    assert summary.kept_host_hours > 0 and summary.rows_written.get(t.REQUESTS, 0) > 0
    assert summary.kept_host_hours_phase2 == 0
    assert _files(tmp_path / "data") == full


def test_nothing_is_kept_where_the_published_files_may_not_be_the_old_data(tmp_path) -> None:
    """A full run, an hour no earlier run read, new points without a host, or every host
    dirty: every host is recomputed."""
    dd = DataDir(tmp_path)
    hour = 3600 * 10**9 * 500_000
    state = PipelineState(watermarks={"a": hour, "b": hour})
    state.segments["raw/metrics/old.parquet"] = Segment("metrics", 1, hour, hour + 10, 5)
    found = Discovered(dirty={hour}, point_hosts={hour: {"a"}}, new={"raw/new.parquet"})
    kept = phase1_kept(dd, state, CFG, hour, found)
    assert kept is not None and kept.dirty == ("a",) and not kept.spans
    assert phase1_kept(dd, state, CFG, hour, None) is None  # a full run
    assert phase1_kept(dd, state, CFG, hour + 2 * 3600 * 10**9, found) is None  # never read
    assert phase1_kept(dd, state, CFG, hour, replace(found, point_hosts={hour: {"a", ""}})
                       ) is None  # points without a host
    assert phase1_kept(dd, state, CFG, hour, replace(found, point_hosts={hour: {"a", "b"}})
                       ) is None  # every host
    only_old = replace(found, new={"raw/metrics/old.parquet"})
    assert phase1_kept(dd, state, CFG, hour, only_old) is None  # its only segment is new
