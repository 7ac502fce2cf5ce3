"""The real-vLLM capacity validation's helpers on made-up steps and telemetry
(:mod:`tests.agent.capacity_run`): the sweep's knee rule, the host's slow phases and the
data dir cut."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.agent.capacity_run import Step, cut, slow_phases, sweep_knee


def _step(concurrency: int, tpot_p99_ms: float, ttft_p99_ms: float) -> Step:
    step = Step(concurrency, min(concurrency, 8), 0, 1, [], 1.0)
    step.figures = {"tpot_p99_ms": tpot_p99_ms, "ttft_p99_ms": ttft_p99_ms}
    return step


def test_the_sweeps_knee_is_the_last_step_meeting_both_slos_in_order() -> None:
    steps = [_step(1, 4.0, 10), _step(2, 4.5, 12), _step(4, 6.1, 15), _step(8, 6.5, 20),
             _step(16, 5.0, 30)]
    # 6.1 and 6.5 > 1.5 x 4.0 break at 4 and 8: two in a row end it; 16 does not count
    assert sweep_knee(steps, 1.5, 2.0).concurrency == 2
    queued = [_step(1, 4.0, 10), _step(8, 4.2, 30), _step(16, 4.2, 2500)]
    assert sweep_knee(queued, 1.5, 2.0).concurrency == 8
    assert sweep_knee(queued, 1.5, 3.0).batch == 8  # past the seats: the same batch
    # the last step breaking it ends it too
    assert sweep_knee([_step(1, 4.0, 10), _step(2, 9.0, 10)], 1.5, 2.0).concurrency == 1


def test_a_lone_step_over_the_slo_between_steps_within_it_is_the_hosts() -> None:
    """A real run's sweep (TPOT p99 per step, ms): the concurrency-2 step's p99, about its
    slowest of 16 requests, broke the limit (3.73) and the knee came out at 1, where the
    seats (8) were: the step time does not fall as the batch grows."""
    steps = [_step(1, 2.49, 7.71), _step(2, 4.01, 18.76), _step(4, 2.31, 14.71),
             _step(8, 2.44, 27.8), _step(16, 4.14, 583.08)]
    assert sweep_knee(steps, 1.5, 2.0).concurrency == 8


def _vllm_spans(data: DataDir, starts_s: list[float], tpot_ms: list[float]) -> None:
    path = data.table_dir(t.SPANS) / "date=2026-01-01" / "hour=00" / "s-1.parquet"
    path.parent.mkdir(parents=True)
    pl.DataFrame({
        c.NAME: [a.VLLM_REQUEST_SPAN] * len(starts_s) + ["other"],
        c.START_NS: [int(s * 1e9) for s in (*starts_s, starts_s[0])],
        c.GEN_AI_TTFT_S: [0.005] * (len(starts_s) + 1),
        c.GEN_AI_DECODE_S: [ms * 1e-3 * 10 for ms in (*tpot_ms, 50.0)],
        c.GEN_AI_COMPLETION_TOKENS: [11] * (len(starts_s) + 1),
    }).write_parquet(path)


def test_a_phase_slower_than_its_kind_is_the_hosts_spell(tmp_path: Path) -> None:
    """Each kind is judged against its own median (a high phase decodes bigger batches,
    more slowly, and is no spell for it); another span's timings do not count."""
    data = DataDir(tmp_path / "data")
    # low phases at 2.0, 2.1, 2.8 ms (a spell), high ones at 2.4, 2.5, 2.6
    tpots = {"low1": 2.0, "high1": 2.4, "low2": 2.1, "high2": 2.5, "low3": 2.8, "high3": 2.6}
    phases = {name: (10 * i * 10**9, (10 * i + 5) * 10**9) for i, name in enumerate(tpots)}
    starts = [10 * i + k for i in range(len(tpots)) for k in (1, 2, 3)]
    _vllm_spans(data, starts, [tpots[name] for name in tpots for _ in range(3)])
    assert slow_phases(data, phases, 1.25) == ["low3"]
    assert slow_phases(data, phases, 1.4) == []
    # a phase nothing was timed in is none
    assert slow_phases(data, {**phases, "low4": (10**12, 10**12 + 1)}, 1.25) == ["low3"]


def test_the_cut_keeps_the_period_in_the_same_layout(tmp_path: Path) -> None:
    src = DataDir(tmp_path / "src")
    metrics = src.root / "raw" / "metrics" / "date=2026-01-01" / "hour=00" / "m-1.parquet"
    spans = src.root / "raw" / "spans" / "date=2026-01-01" / "hour=00" / "s-1.parquet"
    for path in (metrics, spans):
        path.parent.mkdir(parents=True)
    pl.DataFrame({"ts_ns": [5, 10, 15, 20], "value": [1.0, 2.0, 3.0, 4.0]}).write_parquet(metrics)
    pl.DataFrame({"start_ns": [5, 10, 12, 18], "end_ns": [9, 14, 25, 19],
                  "name": ["a", "b", "c", "d"]}).write_parquet(spans)
    out = cut(src, tmp_path / "out", 10, 20)
    kept_metrics = pl.read_parquet(out.root / metrics.relative_to(src.root))
    kept_spans = pl.read_parquet(out.root / spans.relative_to(src.root))
    assert kept_metrics["ts_ns"].to_list() == [10, 15]
    # started and ended in [10, 20): not the one before, nor the one still running at 20
    assert kept_spans["name"].to_list() == ["b", "d"]
    cut(src, tmp_path / "none", 100, 200)
    assert not list((tmp_path / "none").rglob("*.parquet"))  # no empty files written
