"""Capacity validated on the simulator: on random simulated fleets (:mod:`tests.analytics.
capacity_sim`) run end to end (simulator -> collector -> pipeline -> analytics), the knee
and the arrival rate there are within 10% of the simulator's own (measured on what its
roofline executes at steady rates, :mod:`tests.analytics.capacity_truth`, which the
estimator never reads), and MBU within 5 points of the simulator's memory time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from fleetlens.analytics.capacity.config import CapacityConfig
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.runner import read_table
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.capacity_sim import INSTANCES, capacity_fleet, mbu_errors, top_rate
from tests.analytics.capacity_truth import (
    Steady,
    Truth,
    in_fresh_interpreter,
    steady,
    steady_truth,
)

#: the knee judged on the step time itself (TPOT p50): what a roofline predicts
CONFIG = dataclasses.replace(AnalyticsConfig(), failures=FailureConfig(enabled=False),
                             capacity=CapacityConfig(tpot_percentile="p50"))


def measure(seed: int, workdir: Path) -> dict:
    """Run fleet ``seed`` end to end; the estimate against the simulator's own figures."""
    from bench.accuracy import run_end_to_end

    doc, drawn = capacity_fleet(seed)
    run_end_to_end(doc, workdir, CONFIG)
    data = DataDir(workdir / "data")
    row = read_table(data, t.CAPACITY).row(0, named=True)
    truth = in_fresh_interpreter(steady_truth, doc, drawn.tp, top_rate(doc))
    windows = read_table(data, t.CAPACITY_WINDOWS).filter(pl.col(c.REQUESTS) >= 5)
    mbu_error = mbu_errors(data, windows, 60)
    per_instance = row[c.KNEE_RPS] / row[c.INSTANCES]
    return {"seed": seed, "pool": f"{drawn.model} {drawn.gpu} tp{drawn.tp}",
            "knee": row[c.KNEE_BATCH], "true_knee": truth.knee_batch,
            "knee_error": row[c.KNEE_BATCH] / truth.knee_batch - 1,
            "rps_error": per_instance / truth.knee_rps - 1,
            "goodput": row[c.GOODPUT_RPS_PER_GPU], "true_rps_per_gpu": truth.rps_per_gpu,
            "tpot_batch1": row[c.TPOT_BATCH1_S],
            "true_tpot_batch1": truth.tpot_batch1,
            "limit": row[c.KNEE_LIMIT], "extrapolated": row[c.EXTRAPOLATED],
            "mbu_error_median": float(mbu_error.median()),
            "mbu_error_max": float(mbu_error.max()), "windows": mbu_error.len()}


#: The issue's bounds. Measured (docs/benchmarks.md, "Capacity"; `bench/capacity_sim.py`) on
#: seeds 1-9: knee -5.4% to +6.4%, the rate there -4.2% to +5.4%, MBU median error 0.8-2.0
#: points; fresh held-out seeds 13-16: knee -4.4% to +0.6%, rate -2.2% to +4.5%, MBU 0.3-2.9.
#: Seed 9 (Qwen2.5-32B, A100, TP2) was -13.3% while the windows the rate stepped through
#: mid-window (TPOT 10-26% over the steady curve) placed the curve: now only steady windows
#: do; seed 8's MBU was 5.3 points while idle time counted as decode steps.
KNEE_TOLERANCE, RATE_TOLERANCE, MBU_POINTS = 0.10, 0.10, 0.05


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6, 9])
def test_knee_rate_and_mbu_match_the_simulators_roofline(seed: int, tmp_path) -> None:
    got = measure(seed, tmp_path)
    assert got["limit"] == "tpot" and not got["extrapolated"], got
    assert abs(got["knee_error"]) <= KNEE_TOLERANCE, got
    assert abs(got["rps_error"]) <= RATE_TOLERANCE, got
    assert got["mbu_error_median"] <= MBU_POINTS, got


@pytest.mark.slow
def test_the_reference_knee_is_where_the_simulator_meets_the_slo() -> None:
    """The reference is the simulator's truth: run at the reference knee's rate, the
    simulator's TPOT p50 is 1.5x its batch-1 value (2%). The mean-step model that was the
    reference put seed 2's knee at a rate where TPOT p50 is 7% over (its batch 65.4, the
    simulator's 60.2): it left out the prompts that share one mixed step."""
    truth, at_knee = in_fresh_interpreter(_knee_and_a_run_there, 2)
    assert at_knee.tpot_p50 == pytest.approx(1.5 * truth.tpot_batch1, rel=0.02), at_knee
    assert at_knee.batch == pytest.approx(truth.knee_batch, rel=0.03), at_knee


def _knee_and_a_run_there(seed: int) -> tuple[Truth, Steady]:
    """Fleet ``seed``'s reference knee, and a steady run at its rate."""
    doc, drawn = capacity_fleet(seed)
    truth = steady_truth(doc, drawn.tp, top_rate(doc))
    return truth, steady(doc, truth.knee_rps * INSTANCES)
