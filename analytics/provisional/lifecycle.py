"""Provisional incidents from open to confirmed or withdrawn, across live runs.

State: ``state/analytics/provisional.json`` (``{"items": {id: item}}``), written under the
webhooks' delivery lock by :func:`analytics.webhook.notify_new`, so two ``analyze``
processes do not both open one. Each run, with the gauges' candidates and the analysed
(span-based and failure) incidents:

1. an open provisional incident is *confirmed* by the first analysed incident on a
   compatible scope (same service and host, or either of them service- or fleet-wide) that
   overlaps it: starting before its last breaching sample + ``confirm_within_windows``
   windows and ending after its first - 2 windows (a span-based incident starts at the
   window its first slow request arrived in, before the queue showed); a hardware
   warning confirms nothing;
2. one still unconfirmed ``confirm_within_windows`` windows after it began is *withdrawn*;
3. a candidate on the scope of a known item that began within ``merge_gap_s`` of its last
   breach is that item (it extends it: a queue that lasts is one incident, and a withdrawn
   one stays withdrawn until its queue has cleared for ``merge_gap_s``);
4. a candidate already covered by an analysed incident opens nothing (the span-based
   incident is out: nothing provisional to say); any other opens a provisional incident.

Nothing here is written to `incidents`: batch analysis, its tables and the accuracy suites
never see a provisional incident.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from fleetlens.analytics.provenance import read_json, write_json_atomic
from fleetlens.analytics.provisional.config import ProvisionalConfig
from fleetlens.analytics.provisional.gauges import Candidate
from fleetlens.analytics.provisional.guess import Guess
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
STATE_FILE = "provisional.json"
#: `detector` of a provisional incident's row (never stored in `incidents`).
DETECTOR = "provisional:engine_queue"
PROVISIONAL, CONFIRMED, WITHDRAWN = "provisional", "confirmed", "withdrawn"
#: Row key of the guess's one line (moved out of the row by the webhook body).
NOTE = "note"
_WARNING = "warning"


@dataclass
class View:
    """What this run's webhooks need to know of the provisional incidents."""

    #: Open (unconfirmed) provisional incidents: id -> incident-shaped row.
    open: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Their guessed causes (`causes` rows, rank 1; none when the gauges cannot tell).
    causes: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(
        schema=dict(t.table(t.CAUSES).columns)))
    #: Confirmed ones whose confirming incident is analysed now: its id -> their ids (one
    #: service-wide incident may confirm the queues of several hosts).
    confirmed: dict[str, list[str]] = field(default_factory=dict)
    #: Confirmed in this run: id -> the confirming incident's id (an update to post).
    newly_confirmed: dict[str, str] = field(default_factory=dict)
    #: Withdrawn in this run: id -> its row.
    withdrawn: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: How long one waits for confirmation, s (said in the withdrawal).
    confirm_within_s: float = 0.0


def compatible(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two incidents' scopes may be one another's: same service and host, or one
    of them service- or fleet-wide."""
    def same(key: str) -> bool:
        return a[key] == b[key] or FLEET_WIDE in (a[key], b[key])
    return same(c.SERVICE_NAME) and same(c.HOST_NAME)


def _row(cand: Candidate, note: str, cfg: ProvisionalConfig) -> dict[str, Any]:
    return {c.INCIDENT_ID: cand.incident_id, c.METRIC: c.NUM_WAITING,
            c.SERVICE_NAME: cand.service, c.MODEL: cand.model, c.HOST_NAME: cand.host,
            c.START_NS: cand.start_ns, c.END_NS: cand.end_ns, c.PEAK: cand.peak_waiting,
            c.EXPECTED: cand.expected_waiting, c.SEVERITY: cfg.severity, c.DETECTOR: DETECTOR,
            c.DETECTED_NS: cand.detected_ns, c.LEVEL: cand.level, NOTE: note}


def _cause(ident: str, g: Guess) -> dict[str, Any] | None:
    if g.cause is None:
        return None
    return {c.INCIDENT_ID: ident, c.RANK: 1, c.CAUSE: g.cause, c.SUBJECT: g.subject,
            c.SCORE: g.score, c.SHARE_OF_EXCESS: None,
            c.EVIDENCE: json.dumps(g.evidence, sort_keys=True), c.SUMMARY: g.summary}


def _confirming(row: dict[str, Any], incidents: list[dict[str, Any]], within_ns: int,
                window_ns: int) -> dict[str, Any] | None:
    for inc in incidents:
        end = inc[c.END_NS] if inc[c.END_NS] is not None else inc[c.START_NS]
        if (compatible(row, inc) and inc[c.START_NS] <= row[c.END_NS] + within_ns
                and end >= row[c.START_NS] - 2 * window_ns):
            return inc
    return None


def advance(folder: Path, found: list[tuple[Candidate, Guess]], incidents: pl.DataFrame,
            cfg: ProvisionalConfig, window_s: int, merge_gap_s: int, end_ns: int | None
            ) -> View:
    """Move every provisional incident on by one run (see the module docstring) and save."""
    state = read_json(folder / STATE_FILE, {"items": {}})
    items: dict[str, dict[str, Any]] = state["items"]
    within_ns, window_ns = cfg.confirm_within_windows * window_s * NS, window_s * NS
    analysed = sorted((r for r in incidents.iter_rows(named=True)
                       if r[c.SEVERITY] != _WARNING), key=lambda r: r[c.START_NS])
    view = View(confirm_within_s=within_ns / NS)
    for cand, g in found:
        probe = {c.SERVICE_NAME: cand.service, c.HOST_NAME: cand.host}
        known = [i for i in items.values() if compatible(i["row"], probe)
                 and cand.start_ns <= i["row"][c.END_NS] + merge_gap_s * NS]
        for item in known:  # the same queue, still there
            item["row"][c.END_NS] = max(item["row"][c.END_NS], cand.end_ns)
            item["row"][c.PEAK] = max(item["row"][c.PEAK], cand.peak_waiting)
        covered = any(compatible(inc, probe) and inc[c.START_NS] <= cand.end_ns
                      and (inc[c.END_NS] or inc[c.START_NS]) + merge_gap_s * NS
                      >= cand.start_ns for inc in analysed)
        if not known and not covered:
            items[cand.incident_id] = {"row": _row(cand, g.summary, cfg),
                                       "cause": _cause(cand.incident_id, g),
                                       "status": PROVISIONAL, "as": None}
    current = {r[c.INCIDENT_ID] for r in analysed}
    for ident, item in list(items.items()):
        row = item["row"]
        if item["status"] == PROVISIONAL:
            inc = _confirming(row, analysed, within_ns, window_ns)
            if inc is not None:
                item.update(status=CONFIRMED, **{"as": inc[c.INCIDENT_ID]})
                view.newly_confirmed[ident] = inc[c.INCIDENT_ID]
            elif end_ns is not None and end_ns >= row[c.START_NS] + within_ns:
                item["status"] = WITHDRAWN
                view.withdrawn[ident] = row
        if item["status"] == PROVISIONAL:
            view.open[ident] = row
        elif item["status"] == CONFIRMED and item["as"] in current:
            view.confirmed.setdefault(item["as"], []).append(ident)
        stale = end_ns is not None and row[c.END_NS] + 2 * within_ns + merge_gap_s * NS < end_ns
        if item["status"] != PROVISIONAL and stale and item["as"] not in current:
            del items[ident]
    rows = [i["cause"] for i in items.values() if i["status"] == PROVISIONAL and i["cause"]]
    if rows:
        view.causes = pl.DataFrame(rows, schema=view.causes.schema)
    write_json_atomic(folder / STATE_FILE, {"items": items})
    return view


__all__ = ["CONFIRMED", "DETECTOR", "NOTE", "PROVISIONAL", "STATE_FILE", "View",
           "WITHDRAWN", "advance", "compatible"]
