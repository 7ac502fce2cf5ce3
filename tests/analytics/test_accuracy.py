"""The fixed accuracy suite, end to end: simulator -> real collector -> pipeline ->
analytics, scored against the simulator's ground truth (targets of the analytics issue).

Five injected incidents (thermal throttle on one GPU, a traffic surge, KV-cache pressure on
one host at the same time as a collective stall on another service's host, a prefix-cache
drop), each kept only if it measurably moved latency against a paired control run without
incidents (as in the random suite), plus a two-hour incident-free run with a daily cycle
and random bursts. The full
20-incident suite is ``bench/accuracy.py``.
"""

from __future__ import annotations

import pytest

from fleetlens.analytics.accuracy import Score


@pytest.mark.slow
@pytest.mark.e2e
def test_accuracy_targets_end_to_end(tmp_path) -> None:
    from bench.accuracy import SUITES, run_suite

    total, details = run_suite(SUITES["test"], tmp_path, log=lambda _line: None)
    assert isinstance(total, Score)
    summary = total.summary()
    notes = "\n".join(total.misses) + f"\n{details}"
    # incidents that did not measurably move latency against a paired control are dropped,
    # as in the random suite: on this fleet the x2.5 surge moves TPOT p90 x1.16 and the
    # prefix drop TTFT p50 by 9 ms, so three count (thermal, KV pressure, collective stall)
    assert summary["injected"] >= 3, notes
    assert summary["recall"] >= 0.95, notes
    assert summary["top1_accuracy"] >= 0.90, notes
    assert summary["false_incidents_per_clean_day"] <= 1.0, notes
    assert summary["false_incidents_in_incident_runs"] == 0, notes


#: The small random suite: fleets drawn from this seed (never chosen for its figures).
RANDOM_FLEETS, RANDOM_SEED = 3, 1


@pytest.fixture(scope="module")
def small_random_suite(tmp_path_factory):
    """A few random fleets (simulator.randomfleet SMALL), incidents validated against paired
    control runs, scored end to end (about a minute): the summary and the text to show."""
    from bench.accuracy_random import report, run_random
    from fleetlens.simulator.randomfleet import SMALL

    workdir = tmp_path_factory.mktemp("random")
    result = run_random(RANDOM_FLEETS, RANDOM_SEED, SMALL, workdir, log=lambda _line: None)
    notes = report(result) + "\n" + "\n".join(result.score.misses)
    return result.score.summary(), notes


@pytest.mark.slow
@pytest.mark.e2e
def test_random_suite_targets(small_random_suite) -> None:
    """The small random suite meets the issue's targets: recall, top-1 cause, subject and
    false incidents. (Its recall was an expected failure until the paired control judged
    each service's requests apart: the one miss, a prefix drop that moved each of its
    host's two services x1.1, had been validated by their pooled TTFT p50, x1.27.)"""
    summary, notes = small_random_suite
    assert summary["injected"] >= 6, notes  # validation kept enough incidents to mean something
    assert summary["recall"] >= 0.95, notes
    assert summary["top1_accuracy"] >= 0.90, notes
    assert summary["subject_accuracy"] >= 0.85, notes
    assert summary["false_incidents_per_clean_day"] <= 1.0, notes
    assert summary["false_incidents_in_incident_runs"] == 0, notes
