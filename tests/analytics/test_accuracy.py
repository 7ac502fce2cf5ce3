"""The fixed accuracy suite, end to end: simulator -> real collector -> pipeline ->
analytics, scored against the simulator's ground truth (targets of the analytics issue).

Five injected incidents (thermal throttle on one GPU, a traffic surge, KV-cache pressure on
one host at the same time as a collective stall on another service's host, a prefix-cache
drop) plus a two-hour incident-free run with a daily cycle and random bursts. The full
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
    assert summary["injected"] == 5
    assert summary["recall"] >= 0.95, notes
    assert summary["top1_accuracy"] >= 0.90, notes
    assert summary["false_incidents_per_clean_day"] <= 1.0, notes
    assert summary["false_incidents_in_incident_runs"] == 0, notes
