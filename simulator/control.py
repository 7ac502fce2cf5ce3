"""Paired-control validation: did an injected incident measurably move a latency metric?

An injected fault does not always show: KV pressure on an instance with room to spare, a power
cap above what a lightly loaded GPU draws, a surge on a service that was idle. Scoring a
detector on such incidents would punish it for staying quiet. So the same scenario is run
twice with the same seed, once as injected and once as a *control* without any incident
(``run(..., export=False)``), and each incident is kept only when, over the requests that
arrived at its target's engines during its window, the p50 or p90 of TTFT, time per output
token, end-to-end latency or the client-side (through the gateway) TTFT or end-to-end
latency is at least
:data:`MIN_RATIO` x the control's (and :data:`MIN_DELTA_S` more). Overlapping incidents are
drawn on engines they do not share (:mod:`simulator.randomfleet`), so each window compares
one fault with none.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from fleetlens.pipeline.schema import columns as c
from fleetlens.simulator.engine import Instance
from fleetlens.simulator.workload import Request

#: an incident counts when a latency statistic rose to at least this multiple of the control
MIN_RATIO = 1.25
#: ... and by at least this much (a 2 ms TPOT going to 3 ms is not an incident)
MIN_DELTA_S = 0.010
#: fewest requests in the window, in each run, for a comparison to mean anything
MIN_REQUESTS = 10
METRICS = ("ttft", "tpot", "e2e", "client_e2e", "client_ttft")


@dataclass
class LatencyProbe:
    """Keeps each finished request's latencies per engine instance (pass as ``probe=``).

    Rows are (arrival offset s, ttft, tpot, e2e, client e2e or -1, client ttft or -1),
    seconds; the client's figures add the gateway's network hops (request and response).
    """

    start_ns: int
    rows: dict[str, list[tuple[float, ...]]] = field(
        default_factory=lambda: defaultdict(list))

    def __call__(self, inst: Instance, finished: list[Request]) -> None:
        out = self.rows[inst.id]
        for r in finished:
            arrival = (r.engine_ns - self.start_ns) / 1e9
            ttft = r.first_token_t - arrival
            tpot = (r.last_token_t - r.first_token_t) / max(r.generated - 1, 1)
            client = (r.finish_t + r.net_s - (r.client_ns - self.start_ns) / 1e9
                      if r.gateway_span_id else -1.0)
            client_ttft = ttft + 2 * r.net_s if r.gateway_span_id else -1.0
            out.append((arrival, ttft, tpot, r.finish_t - arrival, client, client_ttft))


@dataclass
class Verdict:
    """One incident's validation: the strongest effect found and whether it counts."""

    index: int
    cause: str
    valid: bool
    metric: str  # e.g. "ttft_p90"
    treated_s: float
    control_s: float
    requests: int

    @property
    def ratio(self) -> float:
        return self.treated_s / self.control_s if self.control_s > 0 else float("inf")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _window(probe: LatencyProbe, instances: list[str], lo: float, hi: float) -> list[tuple]:
    return [row for iid in instances for row in probe.rows.get(iid, ()) if lo <= row[0] < hi]


def validate(truth: dict, treated: LatencyProbe, control: LatencyProbe) -> list[Verdict]:
    """A :class:`Verdict` per ground-truth incident of ``truth`` (the run's ground truth)."""
    start_ns = truth[c.START_NS]
    verdicts = []
    for n, gt in enumerate(truth["incidents"]):
        lo, hi = (gt[c.START_NS] - start_ns) / 1e9, (gt[c.END_NS] - start_ns) / 1e9
        a = _window(treated, gt["instances"], lo, hi)
        b = _window(control, gt["instances"], lo, hi)
        best = Verdict(n, gt["cause"], False, "", 0.0, 0.0, len(a))
        if len(a) >= MIN_REQUESTS and len(b) >= MIN_REQUESTS:
            for col, metric in enumerate(METRICS, start=1):
                xa = [row[col] for row in a if row[col] >= 0]
                xb = [row[col] for row in b if row[col] >= 0]
                if len(xa) < MIN_REQUESTS or len(xb) < MIN_REQUESTS:
                    continue
                for q in (0.5, 0.9):
                    ta, tb = _quantile(xa, q), _quantile(xb, q)
                    valid = ta >= MIN_RATIO * tb and ta - tb >= MIN_DELTA_S
                    better = (valid, ta / tb if tb > 0 else 0.0) > (
                        best.valid, best.ratio if best.metric else 0.0)
                    if better:
                        best = Verdict(n, gt["cause"], valid, f"{metric}_p{round(q * 100)}",
                                       ta, tb, len(a))
        verdicts.append(best)
    return verdicts


def without_incidents(doc: dict) -> dict:
    """The control scenario document: ``doc`` with no incident."""
    return {**doc, "incident": []}
