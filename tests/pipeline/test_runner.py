"""Property tests of the whole job over a synthetic fleet: rows in = rows out, dedup, energy
conservation, idempotence (byte-identical reruns) and incremental = full recompute."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from fleetlens.pipeline import runner
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect, parquet_files
from tests.pipeline.fleet import make_fleet, write_batches


def _digest(dd: DataDir) -> dict[str, str]:
    out = {}
    for table in OUTPUTS:
        for path in parquet_files(dd.derived(table)):
            out[str(path.relative_to(dd.root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def fleet():
    return make_fleet()


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, fleet):
    dd = DataDir(tmp_path_factory.mktemp("full") / "data")
    write_batches(dd, fleet)
    summary = Pipeline(dd, PipelineConfig()).run_once()
    return dd, summary


def test_every_request_exactly_once(full_run, fleet) -> None:
    dd, summary = full_run
    con = connect(dd)
    n, distinct = con.sql("select count(*), count(distinct (trace_id, span_id)) from requests"
                          ).fetchall()[0]
    assert n == distinct == fleet.distinct_requests
    assert summary.dirty_hours == 2  # the data crosses an hour boundary
    assert con.sql("select count(*) from request_energy").fetchall()[0][0] == n


def test_windows_count_every_request_once_per_level(full_run, fleet) -> None:
    con = connect(full_run[0])
    per_host, fleet_rows = con.sql(
        f"select sum(requests) filter (where host_name != '{FLEET_WIDE}'),"
        f" sum(requests) filter (where host_name = '{FLEET_WIDE}') from windows").fetchall()[0]
    assert per_host == fleet_rows == fleet.distinct_requests


def test_energy_is_conserved_per_gpu_per_window(full_run) -> None:
    frame = connect(full_run[0]).sql("select * from gpu_window_energy").pl()
    assert frame.height > 0
    diff = (frame["attributed_j"] + frame["idle_j"] - frame["measured_j"]).abs()
    assert (diff <= 0.005 * frame["measured_j"].abs() + 1e-6).all()
    assert (frame["idle_j"] >= -1e-9).all() and (frame["attributed_j"] >= 0).all()
    # and the requests received exactly the attributed joules
    con = connect(full_run[0])
    attributed = frame["attributed_j"].sum()
    given = con.sql("select sum(energy_j) from request_energy").fetchall()[0][0]
    assert given == pytest.approx(attributed, rel=1e-9)


def test_mapped_requests_are_fully_covered(full_run) -> None:
    con = connect(full_run[0])
    coverage = con.sql(
        "select min(attribution_coverage) from request_energy e join requests r using "
        "(request_id) where r.arrival_ns > (select min(arrival_ns) + 60e9 from requests)"
    ).fetchall()[0][0]
    assert coverage > 0.99


def test_rerun_is_byte_identical(tmp_path: Path, fleet, full_run) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    Pipeline(dd, PipelineConfig()).run_once()
    first = _digest(dd)
    again = Pipeline(dd, PipelineConfig()).run_once(full=True)
    assert again.dirty_hours == 2
    assert _digest(dd) == first
    # and equal to the other full run's files (independent of the data dir)
    other = _digest(full_run[0])
    assert sorted(other) == sorted(first) and other == first


def test_incremental_equals_full_recompute(tmp_path: Path, fleet, full_run) -> None:
    dd = DataDir(tmp_path / "data")
    job = Pipeline(dd, PipelineConfig())
    for i in range(len(fleet.span_batches)):
        write_batches(dd, fleet, range(i, i + 1))
        summary = job.run_once()
        assert summary.new_segments == 2
    assert _digest(dd) == _digest(full_run[0])
    assert job.run_once().dirty_hours == 0


def test_too_late_data_is_counted_not_used_to_reopen_hours(tmp_path: Path, fleet) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet, range(0, 3))
    cfg = PipelineConfig(lateness_s=0)
    Pipeline(dd, cfg).run_once()
    write_batches(dd, fleet, range(3, 4))
    summary = Pipeline(dd, cfg).run_once()
    assert summary.too_late_rows > 0
    full = Pipeline(dd, cfg).run_once(full=True)
    assert full.too_late_rows == 0


def test_every_output_table_is_visible_in_sql(full_run) -> None:
    con = connect(full_run[0])
    for table in OUTPUTS:
        assert con.sql(f'select count(*) from "{table}"').fetchall()[0][0] > 0, table
    spec = t.table(t.WINDOWS)
    cols = set(con.sql("select * from windows limit 0").pl().columns)
    assert set(spec.columns) <= cols


def test_dimensions_become_request_columns(full_run, fleet) -> None:
    frame = connect(full_run[0]).sql("select region, count(*) n from requests group by 1").pl()
    assert frame.to_dicts() == [{"region": "eu", "n": fleet.distinct_requests}]


def test_late_data_within_lateness_updates_its_window(tmp_path: Path) -> None:
    from fleetlens.pipeline.schema import tables as tt
    from tests.pipeline.rawdata import NS, T0, spans_frame, vllm_span, write_raw

    dd = DataDir(tmp_path / "data")
    job = Pipeline(dd, PipelineConfig(lateness_s=300))
    write_raw(dd, tt.SPANS, spans_frame([vllm_span(i, start_ns=T0 + i * 30 * NS)
                                         for i in range(1, 10)]), seq=1)
    job.run_once()
    con = connect(dd)
    first = con.sql(f"select requests from windows where window_start_ns = {T0} and "
                    f"host_name = '{FLEET_WIDE}'").fetchall()
    assert first == [(1,)]  # the span at T0 + 30 s
    # a request of the first minute arrives 4 minutes late (within 5 minutes of lateness)
    write_raw(dd, tt.SPANS, spans_frame([vllm_span(99, start_ns=T0 + 5 * NS)]), seq=2)
    summary = job.run_once()
    assert summary.too_late_rows == 0 and summary.dirty_hours == 1
    again = connect(dd).sql(f"select requests from windows where window_start_ns = {T0} and "
                            f"host_name = '{FLEET_WIDE}'").fetchall()
    assert again == [(2,)]


def test_five_minute_windows(tmp_path: Path, fleet) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    Pipeline(dd, PipelineConfig(window_s=300)).run_once()
    con = connect(dd)
    starts, sizes, total = con.sql(
        "select count(distinct window_start_ns % 300000000000), min(window_s), sum(requests) "
        f"from windows where host_name = '{FLEET_WIDE}'").fetchall()[0]
    assert (starts, sizes, total) == (1, 300, fleet.distinct_requests)
    energy = con.sql("select sum(measured_j), sum(attributed_j + idle_j) from gpu_window_energy"
                     ).fetchall()[0]
    assert energy[0] == pytest.approx(energy[1], rel=1e-12)


def test_a_crashed_run_is_redone_by_the_next(tmp_path: Path, fleet, full_run,
                                             monkeypatch) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    job = Pipeline(dd, PipelineConfig())
    real = Pipeline._phase2
    calls = []

    def crash_on_second_hour(self, hour, *args):
        calls.append(hour)
        if len(calls) == 2:
            raise OSError("disk gone")
        return real(self, hour, *args)

    monkeypatch.setattr(Pipeline, "_phase2", crash_on_second_hour)
    with pytest.raises(OSError):
        job.run_once()
    assert not (dd.state / "pipeline.json").exists()
    monkeypatch.setattr(Pipeline, "_phase2", real)
    assert job.run_once().dirty_hours == 2
    assert _digest(dd) == _digest(full_run[0])


def test_a_failed_background_write_fails_the_run_and_is_redone(tmp_path: Path, fleet, full_run,
                                                               monkeypatch) -> None:
    # Partitions are published on a writer thread: its failure must surface, leave the state
    # unsaved, and no write may still run after run_once returns.
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    real = runner.publish
    writes = []

    def fail_on_windows(data_dir, table, hour, frame):
        if table == t.WINDOWS:
            raise OSError("disk full")
        writes.append(table)
        return real(data_dir, table, hour, frame)

    monkeypatch.setattr(runner, "publish", fail_on_windows)
    job = Pipeline(dd, PipelineConfig())
    with pytest.raises(OSError, match="disk full"):
        job.run_once()
    assert writes and not (dd.state / "pipeline.json").exists()
    busy = [th.name for th in threading.enumerate() if th.name.startswith(("publish", "phase1"))]
    assert busy == []  # nothing left running in the background
    monkeypatch.setattr(runner, "publish", real)
    assert job.run_once().dirty_hours == 2
    assert _digest(dd) == _digest(full_run[0])


def test_hours_one_at_a_time_give_the_same_files_and_summary(tmp_path: Path, fleet, full_run,
                                                             monkeypatch) -> None:
    # Phase 1 runs PHASE1_PARALLEL hours side by side: one at a time must not differ.
    monkeypatch.setattr(runner, "PHASE1_PARALLEL", 1)
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    summary = Pipeline(dd, PipelineConfig()).run_once()
    assert _digest(dd) == _digest(full_run[0])
    assert summary.rows_written == full_run[1].rows_written


def test_a_failing_hour_in_parallel_phase_1_fails_the_run(tmp_path: Path, fleet,
                                                          monkeypatch) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    real = Pipeline._phase1
    hours = []

    def fail_second_hour(self, state, hour):
        hours.append(hour)
        if len(hours) == 2:
            raise MemoryError("hour too big")
        return real(self, state, hour)

    monkeypatch.setattr(Pipeline, "_phase1", fail_second_hour)
    with pytest.raises(MemoryError):
        Pipeline(dd, PipelineConfig()).run_once()
    assert len(hours) == 2 and not (dd.state / "pipeline.json").exists()
