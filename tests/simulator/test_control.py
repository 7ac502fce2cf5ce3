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


def _two_services(slow_every: int, slow_factor: float = 1.0, slow_plus_s: float = 0.0
                  ) -> LatencyProbe:
    """A host serving a 10 ms service a request a second and a 20-300 ms one (TTFT, spread
    evenly) every ``slow_every`` seconds; from 900 s on the slow one's TTFT is ``x factor``
    and ``+ plus`` s."""
    probe = LatencyProbe(0)
    for t in range(1800):
        probe.rows["h1/fast"].append((float(t), 0.010, 0.02, 2.0, -1.0, -1.0, 0))
        if t % slow_every == 0:
            ttft = 0.020 + 0.280 * ((t * 7919) % 1000) / 1000
            if t >= 900:
                ttft = ttft * slow_factor + slow_plus_s
            probe.rows["h1/slow"].append((float(t), ttft, 0.02, 2.0, -1.0, -1.0, 0))
    return probe


def _host_truth() -> dict:
    return {c.START_NS: 0, c.END_NS: 1800 * NS, "incidents": [
        {"cause": "prefix_cache_drop", c.START_NS: 900 * NS, c.END_NS: 1200 * NS,
         "instances": ["h1/fast", "h1/slow"]}]}


def test_a_pooled_percentile_that_no_service_moved_does_not_count() -> None:
    # Random fleet 1000 (the small suite): a prefix drop on a host serving two services;
    # each service's TTFT p50 x1.1, but their requests pooled rose x1.27 at the p50, which
    # sat low in the slower service's spread. Here the slow service's prompts cost 15 ms
    # more each (its p50 x1.09): pooled, the p50 is its fastest request, x1.6.
    verdict, = validate(_host_truth(), _two_services(1, slow_plus_s=0.015), _two_services(1))
    assert not verdict.valid, verdict


def test_one_services_move_counts_though_pooled_with_a_faster_service() -> None:
    # Random fleets 26005, 29000: one service's TTFT p50 x1.6, pooled with another's many
    # faster requests the p50 and p90 hardly moved.
    verdict, = validate(_host_truth(), _two_services(10, slow_factor=1.6), _two_services(10))
    assert verdict.valid and verdict.service == "slow", verdict
