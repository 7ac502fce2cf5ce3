"""Score detected incidents and causes against a simulator's ground truth.

A ground-truth incident (``cause``, ``subject``, ``start_ns``, ``end_ns``, and the
``hosts`` and service it touched) is *detected* when an incident overlaps its window (plus a
grace period for the queue to drain) in a matching scope: the same service (or the fleet),
and for a host-level incident one of the hosts it touched. Each detected incident is
credited to at most one ground-truth incident; the rest are false incidents, except those on
a *natural spike* that name its cause: a natural surge (a burst the replayed traffic brought by
itself that measurably moved latency) named ``traffic_surge``, or a natural saturation (a KV
cache the workload alone filled until the engine preempted, with latency moved) named
``kv_cache_pressure``, both labelled by :mod:`fleetlens.simulator.natural`. Such a spike is
real and rightly named. Natural spikes are not part of recall; those named right are counted
apart (``natural_named``, the saturations also in ``saturation_named``) so that a reader can
add them back.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000


@dataclass
class Score:
    """Accuracy figures of one or more runs."""

    injected: int = 0
    detected: int = 0
    top1: int = 0
    top3: int = 0
    subject: int = 0
    false_incidents: int = 0
    clean_false_incidents: int = 0
    clean_days: float = 0.0
    #: incidents on a natural spike named its cause (not false), of them on a saturation;
    #: natural spikes labelled (the caller counts them: a treated run and its control share
    #: theirs)
    natural_named: int = 0
    saturation_named: int = 0
    natural_surges: int = 0
    natural_saturations: int = 0
    delays_s: list[float] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    #: (injected cause, top-1 cause or "missed") -> count, for a confusion matrix
    confusion: Counter = field(default_factory=Counter)

    def add(self, other: Score) -> None:
        for name in ("injected", "detected", "top1", "top3", "subject", "false_incidents",
                     "clean_false_incidents", "clean_days", "natural_named", "saturation_named",
                     "natural_surges", "natural_saturations"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.delays_s += other.delays_s
        self.misses += other.misses
        self.confusion.update(other.confusion)

    def summary(self) -> dict[str, Any]:
        """The figures the acceptance criteria name."""
        det = max(self.detected, 1)
        return {
            "injected": self.injected,
            "recall": self.detected / max(self.injected, 1),
            "top1_accuracy": self.top1 / det,
            "top3_accuracy": self.top3 / det,
            "subject_accuracy": self.subject / det,
            "top1_of_injected": self.top1 / max(self.injected, 1),
            "false_incidents_in_incident_runs": self.false_incidents,
            "false_incidents_per_clean_day": (self.clean_false_incidents / self.clean_days
                                              if self.clean_days else None),
            "median_detection_delay_s": (statistics.median(self.delays_s)
                                         if self.delays_s else None),
            "natural_surges_named": self.natural_named,
            "natural_saturations_named": self.saturation_named,
        }


def _scope_matches(truth: dict[str, Any], incident: dict[str, Any]) -> bool:
    service = truth.get(c.SERVICE_NAME)
    hosts = set(truth.get("hosts") or [])
    if service and incident[c.SERVICE_NAME] not in (service, FLEET_WIDE):
        # A host/GPU incident names no service: match by host instead.
        if incident[c.HOST_NAME] not in hosts:
            return False
    if incident[c.HOST_NAME] != FLEET_WIDE and hosts and incident[c.HOST_NAME] not in hosts:
        return False
    return True


def _ranked(causes: pl.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """incident id -> its (cause, subject) pairs, best first."""
    ranked: dict[str, list[tuple[str, str]]] = {}
    for row in causes.sort(c.RANK).iter_rows(named=True):
        ranked.setdefault(row[c.INCIDENT_ID], []).append((row[c.CAUSE], row[c.SUBJECT]))
    return ranked


def _natural_under(incident: dict[str, Any], natural: Sequence[dict[str, Any]],
                   grace_s: float) -> list[dict[str, Any]]:
    """The natural spikes ``incident`` overlaps (its service's, or any for a fleet-wide one)."""
    return [n for n in natural
            if incident[c.SERVICE_NAME] in (n["service"], FLEET_WIDE)
            and incident[c.START_NS] < n[c.END_NS] + int(grace_s * NS)
            and incident[c.END_NS] > n[c.START_NS]]


def _judge_unmatched(score: Score, incident: dict[str, Any], top: list[tuple[str, str]],
                     natural: Sequence[dict[str, Any]], grace_s: float) -> None:
    """An incident no injected one explains: a natural spike named right, else false."""
    under = _natural_under(incident, natural, grace_s)
    right = {n.get("cause", Cause.TRAFFIC_SURGE) for n in under}
    if top and top[0][0] in right:
        score.natural_named += 1
        score.saturation_named += top[0][0] == Cause.KV_CACHE_PRESSURE
        return
    score.false_incidents += 1
    kinds = "/".join(sorted(right))
    score.misses.append(
        f"false incident {incident[c.METRIC]} {incident[c.SERVICE_NAME]}/"
        f"{incident[c.HOST_NAME]} at {incident[c.START_NS]}"
        + (f" (on a natural {kinds} spike, named {top[0][0] if top else 'nothing'})"
           if under else ""))


def score_run(truth: list[dict[str, Any]], incidents: pl.DataFrame, causes: pl.DataFrame,
              grace_s: float = 180.0, excused: Sequence[dict[str, Any]] = (),
              natural: Sequence[dict[str, Any]] = ()) -> Score:
    """Score one run's incidents and causes against its ground-truth incidents.

    ``excused``: injected incidents left out of the score (their effect was too small to
    count, see bench/accuracy_random.py); an incident near one is not a false incident.
    ``natural``: the run's natural spikes (``service``, ``start_ns``, ``end_ns`` and the
    ``cause`` right for it, ``traffic_surge`` where none is given).
    """
    score = Score(injected=len(truth))
    ranked = _ranked(causes)
    rows = incidents.sort(c.START_NS).to_dicts()
    used: set[str] = set()
    for gt in sorted(truth, key=lambda g: g[c.START_NS]):
        lo, hi = gt[c.START_NS], gt[c.END_NS] + int(grace_s * NS)
        candidates = [r for r in rows if r[c.INCIDENT_ID] not in used
                      and r[c.START_NS] < hi and r[c.END_NS] > lo and _scope_matches(gt, r)]
        if not candidates:
            score.misses.append(f"missed {gt['cause']} {gt['subject']}")
            score.confusion[(gt["cause"], "missed")] += 1
            continue
        # Prefer the incident that names this cause, then the earliest.
        best = min(candidates, key=lambda r: (
            ranked.get(r[c.INCIDENT_ID], [("", "")])[0][0] != gt["cause"], r[c.START_NS]))
        used.add(best[c.INCIDENT_ID])
        score.detected += 1
        score.delays_s.append(max(0.0, (best[c.DETECTED_NS] - gt[c.START_NS]) / NS))
        top = ranked.get(best[c.INCIDENT_ID], [])
        score.confusion[(gt["cause"], top[0][0] if top else "none")] += 1
        if top and top[0][0] == gt["cause"]:
            score.top1 += 1
        else:
            score.misses.append(f"{gt['cause']} {gt['subject']} ranked as {top[:3]}")
        if any(cause == gt["cause"] for cause, _ in top[:3]):
            score.top3 += 1
        if top and top[0][1] == gt["subject"]:
            score.subject += 1
        elif top:
            score.misses.append(f"{gt['cause']}: subject {top[0][1]} != {gt['subject']}")
    # Incidents overlapping a ground-truth window but left over (a second host of the same
    # cause, an echo at another level) are not false alarms; the rest are.
    for r in rows:
        if r[c.INCIDENT_ID] in used:
            continue
        near = any(r[c.START_NS] < g[c.END_NS] + int(grace_s * NS) and r[c.END_NS] > g[c.START_NS]
                   for g in [*truth, *excused])
        if not near:
            _judge_unmatched(score, r, ranked.get(r[c.INCIDENT_ID], []), natural, grace_s)
    return score


def score_clean(incidents: pl.DataFrame, days: float, causes: pl.DataFrame | None = None,
                natural: Sequence[dict[str, Any]] = (), grace_s: float = 180.0) -> Score:
    """An incident-free run: every incident is a false one, but for a natural spike named
    its cause (``natural`` and ``causes`` given; see the module doc)."""
    score = Score(clean_days=days)
    ranked = _ranked(causes) if causes is not None else {}
    for r in incidents.sort(c.START_NS).iter_rows(named=True):
        _judge_unmatched(score, r, ranked.get(r[c.INCIDENT_ID], []), natural, grace_s)
    score.clean_false_incidents, score.false_incidents = score.false_incidents, 0
    return score
