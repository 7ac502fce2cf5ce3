"""Paired-control validation: did an injected incident measurably move a latency metric?

An injected fault does not always show: KV pressure on an instance with room to spare, a power
cap above what a lightly loaded GPU draws, a surge on a service that was idle. Scoring a
detector on such incidents would punish it for staying quiet. So the same scenario is run
twice with the same seed, once as injected and once as a *control* without any incident
(``run(..., export=False)``), and each incident is kept only when, over the requests that
arrived at its target's engines during its window (each service's requests apart: a
pooled percentile of two services is neither's), the p50 or p90 of TTFT, time per output
token, end-to-end latency or the client-side (through the gateway) TTFT or end-to-end
latency is at least
:data:`MIN_RATIO` x the control's (and :data:`MIN_DELTA_S` more). Overlapping incidents are
drawn on engines they do not share (:mod:`simulator.randomfleet`), so each window compares
one fault with none.

An incident whose target was already that much slower than the control in the
:data:`PRE_S` seconds before it started (the backlog an earlier incident left on the same
engines, which the control does not have) is *confounded*: the difference in its window is
not its own doing, so it is dropped too, and reported as such.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from fleetlens.pipeline.schema import FAILURE_CAUSES
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
#: the probe's last column: how many times the request was preempted
PREEMPTIONS = "preemptions"
#: the look before an incident for a difference it cannot have caused, seconds
PRE_S = 300.0


@dataclass
class LatencyProbe:
    """Keeps each finished request's latencies per engine instance (pass as ``probe=``).

    Rows are (arrival offset s, ttft, tpot, e2e, client e2e or -1, client ttft or -1,
    preemptions), seconds; the client's figures add the gateway's network hops (request and
    response); ``preemptions`` counts the times the engine evicted the request's KV blocks
    (the simulator's own record of cache saturation, see :mod:`simulator.natural`).
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
            out.append((arrival, ttft, tpot, r.finish_t - arrival, client, client_ttft,
                        r.preemptions))


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
    #: the target already differed from the control before the incident (see module doc)
    confounded: bool = False
    #: the service whose requests the figures are of (each is judged apart)
    service: str = ""

    @property
    def ratio(self) -> float:
        return self.treated_s / self.control_s if self.control_s > 0 else float("inf")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _window(probe: LatencyProbe, instances: list[str], lo: float, hi: float) -> list[tuple]:
    return [row for iid in instances for row in probe.rows.get(iid, ()) if lo <= row[0] < hi]


def _moved(a: list[tuple], b: list[tuple], col: int, q: float) -> tuple[bool, float, float]:
    """Whether quantile ``q`` of latency column ``col`` is measurably higher in ``a`` than in
    ``b``, with both values (False when either side has too few requests)."""
    xa = [row[col] for row in a if row[col] >= 0]
    xb = [row[col] for row in b if row[col] >= 0]
    if len(xa) < MIN_REQUESTS or len(xb) < MIN_REQUESTS:
        return False, 0.0, 0.0
    ta, tb = _quantile(xa, q), _quantile(xb, q)
    return ta >= MIN_RATIO * tb and ta - tb >= MIN_DELTA_S, ta, tb


def service_of(instance_id: str) -> str:
    """The service of an engine instance id (``host/service`` or ``host/service/k``, as
    :mod:`simulator.fleet` names them)."""
    parts = instance_id.split("/")
    return parts[1] if len(parts) > 1 else instance_id


def _by_service(instances: list[str]) -> list[list[str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for iid in instances:
        groups[service_of(iid)].append(iid)
    return list(groups.values())


def _judge(n: int, cause: str, treated: LatencyProbe, control: LatencyProbe,
           instances: list[str], lo: float, hi: float) -> Verdict:
    """The strongest effect on the requests of ``instances`` in ``[lo, hi)`` s."""
    a = _window(treated, instances, lo, hi)
    b = _window(control, instances, lo, hi)
    pre_a = _window(treated, instances, lo - PRE_S, lo)
    pre_b = _window(control, instances, lo - PRE_S, lo)
    best = Verdict(n, cause, False, "", 0.0, 0.0, len(a),
                   service=service_of(instances[0]) if instances else "")
    confounded = False
    if len(a) >= MIN_REQUESTS and len(b) >= MIN_REQUESTS:
        for col, metric in enumerate(METRICS, start=1):
            for q in (0.5, 0.9):
                moved, ta, tb = _moved(a, b, col, q)
                if moved and _moved(pre_a, pre_b, col, q)[0]:
                    confounded, moved = True, False  # it was so before it began
                if (moved, ta / tb if tb > 0 else 0.0) > _strength(best) and ta > 0:
                    best = Verdict(n, cause, moved, f"{metric}_p{round(q * 100)}", ta, tb,
                                   len(a), service=best.service)
    best.confounded = confounded and not best.valid
    return best


def _strength(verdict: Verdict) -> tuple[bool, float]:
    """Valid before not, then the larger ratio (none without a metric)."""
    return verdict.valid, verdict.ratio if verdict.metric else 0.0


def validate(truth: dict, treated: LatencyProbe, control: LatencyProbe) -> list[Verdict]:
    """A :class:`Verdict` per ground-truth incident of ``truth`` (the run's ground truth).

    The requests of each service among the incident's engines are judged apart and the
    strongest effect is kept: a host's services can differ 5x in latency, so a percentile
    of their requests pooled sits between them and moves when neither service's does (a
    prefix drop on a host serving a 10 ms and a 60 ms service: pooled TTFT p50 x1.27,
    each service x1.1), or stays put while one service's moves x1.6 (random seeds 26-31:
    five incidents).
    """
    start_ns = truth[c.START_NS]
    verdicts = []
    for n, gt in enumerate(truth["incidents"]):
        if gt["cause"] in FAILURE_CAUSES:
            # A failure or a change shows in its own telemetry (failed scrapes, a silent agent,
            # a new fingerprint, error spans), whatever latency did: always counted.
            verdicts.append(Verdict(n, gt["cause"], True, "telemetry", 1.0, 1.0, 0))
            continue
        lo, hi = (gt[c.START_NS] - start_ns) / 1e9, (gt[c.END_NS] - start_ns) / 1e9
        judged = [_judge(n, gt["cause"], treated, control, group, lo, hi)
                  for group in _by_service(gt["instances"]) or [[]]]
        best = max(judged, key=_strength)  # the first of equals, as one pooled judgement
        best.confounded = any(v.confounded for v in judged) and not best.valid
        verdicts.append(best)
    return verdicts


def probe_frame(probe: LatencyProbe) -> dict[str, list]:
    """A probe's rows as columns (instance, arrival, ttft, ..., preemptions), to keep
    beside a run."""
    names = [*METRICS, PREEMPTIONS]
    cols: dict[str, list] = {"instance": [], "arrival": [], **{m: [] for m in names}}
    for iid, rows in probe.rows.items():
        for row in rows:
            cols["instance"].append(iid)
            cols["arrival"].append(row[0])
            for m, v in zip(names, row[1:], strict=True):
                cols[m].append(v)
    return cols


def probe_from(frame: dict[str, list], start_ns: int) -> LatencyProbe:
    """The :class:`LatencyProbe` of :func:`probe_frame`'s columns (a frame kept before
    preemptions were recorded reads as none)."""
    probe = LatencyProbe(start_ns)
    preempted = frame.get(PREEMPTIONS) or [0] * len(frame["instance"])
    for i, iid in enumerate(frame["instance"]):
        probe.rows[iid].append((frame["arrival"][i], *(frame[m][i] for m in METRICS),
                                preempted[i]))
    return probe


def without_incidents(doc: dict) -> dict:
    """The control scenario document: ``doc`` with no incident."""
    return {**doc, "incident": []}
