"""The real-vLLM capacity validation's helpers on made-up steps and telemetry
(:mod:`tests.agent.capacity_run`): the sweep's knee rule and the data dir cut."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetlens.pipeline.storage import DataDir
from tests.agent.capacity_run import Step, cut, sweep_knee


def _step(concurrency: int, tpot_p99_ms: float, ttft_p99_ms: float) -> Step:
    step = Step(concurrency, min(concurrency, 8), 0, 1, [], 1.0)
    step.figures = {"tpot_p99_ms": tpot_p99_ms, "ttft_p99_ms": ttft_p99_ms}
    return step


def test_the_sweeps_knee_is_the_last_step_meeting_both_slos_in_order() -> None:
    steps = [_step(1, 4.0, 10), _step(2, 4.5, 12), _step(4, 6.1, 15), _step(8, 5.0, 20)]
    # 6.1 > 1.5 x 4.0 breaks at 4; the recovered step at 8 does not count (in order)
    assert sweep_knee(steps, 1.5, 2.0).concurrency == 2
    queued = [_step(1, 4.0, 10), _step(8, 4.2, 30), _step(16, 4.2, 2500)]
    assert sweep_knee(queued, 1.5, 2.0).concurrency == 8
    assert sweep_knee(queued, 1.5, 3.0).batch == 8  # past the seats: the same batch
    assert sweep_knee([_step(1, 4.0, 10), _step(2, 9.0, 10)], 1.5, 2.0).concurrency == 1


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
