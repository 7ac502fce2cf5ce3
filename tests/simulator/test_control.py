"""Paired-control validation (simulator/control.py): which injected incidents count."""

from __future__ import annotations

from fleetlens.pipeline.schema import columns as c
from fleetlens.simulator.control import LatencyProbe, probe_frame, probe_from, validate

NS = 1_000_000_000


def _probe(slow_from: float, slow_to: float, factor: float) -> LatencyProbe:
    """One instance, a request a second for 30 min; TTFT ``factor`` x in [from, to)."""
    probe = LatencyProbe(0)
    for t in range(1800):
        k = factor if slow_from <= t < slow_to else 1.0
        probe.rows["i1"].append((float(t), 0.2 * k, 0.02, 2.0, -1.0, -1.0, 0))
    return probe


def _truth(start_s: float, end_s: float) -> dict:
    return {c.START_NS: 0, c.END_NS: 1800 * NS, "incidents": [
        {"cause": "network_overhead", c.START_NS: int(start_s * NS),
         c.END_NS: int(end_s * NS), "instances": ["i1"]}]}


def test_an_incident_that_moved_latency_counts() -> None:
    control = _probe(0, 0, 1.0)
    verdict, = validate(_truth(900, 1200), _probe(900, 1200, 3.0), control)
    assert verdict.valid and not verdict.confounded and verdict.metric == "ttft_p50"


def test_an_incident_inside_an_earlier_backlog_is_confounded() -> None:
    # Random fleet 7008: after prompts x5 the service never drained, and every later
    # incident on it was 'validated' by a backlog it did not cause (client TTFT x6413).
    control = _probe(0, 0, 1.0)
    verdict, = validate(_truth(900, 1200), _probe(300, 1800, 3.0), control)
    assert not verdict.valid and verdict.confounded


def test_probes_round_trip() -> None:
    probe = _probe(10, 20, 2.0)
    again = probe_from(probe_frame(probe), 0)
    assert again.rows == probe.rows
