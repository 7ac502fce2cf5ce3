"""What a webhook receives, per format: native JSON, Slack, PagerDuty Events v2, Alertmanager.

Every builder works from a *snapshot*, the native body of an incident taken when it was
first seen (:func:`native_body`), so that a resolve carries the same labels and dedup key as
its trigger even when a later run ranks the causes differently.

- ``native``: the snapshot as JSON, signed with HMAC-SHA256 when the hook has a ``secret``
  (:func:`signature_headers`); triggers only.
- ``slack``: ``{"text", "blocks"}`` for an incoming webhook; telemetry values are escaped
  for Slack's mrkdwn (``<``, ``>``, ``&``) so a service name cannot forge a link; triggers
  only.
- ``pagerduty``: an Events API v2 event, ``trigger`` then ``resolve`` with the incident id as
  ``dedup_key``.
- ``alertmanager``: the v2 ``POST /api/v2/alerts`` list; firing alerts have no ``endsAt`` and
  are re-posted every run while open (Alertmanager resolves an alert that is not refreshed
  within its ``resolve_timeout``); resolved ones carry ``endsAt``.

Provisional incidents (:mod:`analytics.provisional`, live only) travel as incidents whose
``detector`` is :data:`PROVISIONAL_DETECTOR`: their native body has ``"status":
"provisional"`` and the guess's line as ``note``. Their confirmation or withdrawal is an
*update* (:mod:`analytics.webhook_updates`, type :data:`UPDATE_TYPE`) keyed by the
provisional incident's id (:func:`alert_key`): PagerDuty gets a ``trigger`` with the same
``dedup_key``, Alertmanager the same labels with new annotations, so one page, then its
update.

SLO burn-rate alerts (:mod:`analytics.slos`) travel the same way as incident-shaped rows
whose ``detector`` is :data:`SLO_DETECTOR`: their snapshot's ``type`` is
:data:`SLO_ALERT_TYPE`, their severity ``page`` or ``ticket``, and each format names the SLO,
both burn rates and the budget left instead of a cause.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import time
from typing import Any

import polars as pl

from fleetlens.analytics.config import WEBHOOK_FORMATS
from fleetlens.analytics.failures.findings import DETECTOR_PREFIX
from fleetlens.analytics.incident_facts import incident_phases
from fleetlens.analytics.provisional.lifecycle import DETECTOR as PROVISIONAL_DETECTOR
from fleetlens.analytics.provisional.lifecycle import NOTE
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: Causes included in a native payload.
TOP_CAUSES = 3
FORMATS = WEBHOOK_FORMATS
#: Formats that are told when an incident ends.
RESOLVING = frozenset({"pagerduty", "alertmanager"})
SIGNATURE_HEADER = "X-Fleetlens-Signature"
TIMESTAMP_HEADER = "X-Fleetlens-Timestamp"
ALERT_NAME = "FleetlensIncident"
#: Alertmanager ``alertname`` of SLO burn-rate alerts (the generated Prometheus rules use it).
SLO_ALERT_NAME = "FleetlensSLOBurnRate"
#: ``detector`` of an SLO alert's incident-shaped row, and its snapshot's ``type``.
SLO_DETECTOR = "slo_burn_rate"
SLO_ALERT_TYPE = "fleetlens.slo_alert"
#: ``type`` of an update of an incident already posted (a provisional one confirmed or
#: withdrawn); its top-level ``incident_id`` is the id it was first posted with.
UPDATE_TYPE = "fleetlens.incident_update"
#: ``status`` of an incident body: provisional (from the gauges), and of an update.
STATUS_PROVISIONAL, STATUS_CONFIRMED, STATUS_WITHDRAWN = "provisional", "confirmed", "withdrawn"
#: PagerDuty's four severities for ours; a warning (a hot GPU, nothing failed) is "info",
#: below a minor incident's "warning".
_PD_SEVERITY = {"warning": "info", "minor": "warning", "major": "error", "critical": "critical",
                "page": "critical", "ticket": "warning"}
_ANY = "*"


def native_body(incident: dict[str, Any], causes: pl.DataFrame) -> dict[str, Any]:
    """The native JSON body of one incident: its row, its top causes (evidence parsed) and
    its excess latency by phase (``phases``: ``phase, excess_s, share``; empty for a failure).

    An SLO alert's row (``detector`` :data:`SLO_DETECTOR`) has no causes and its own type.
    """
    if incident.get(c.DETECTOR) == SLO_DETECTOR:
        return {"type": SLO_ALERT_TYPE, "incident": dict(incident), "causes": []}
    if incident.get(c.DETECTOR) == PROVISIONAL_DETECTOR:
        row = {k: v for k, v in incident.items() if k != NOTE}
        mine = causes.filter(pl.col(c.INCIDENT_ID) == row[c.INCIDENT_ID]).sort(c.RANK)
        top = [{**r, c.EVIDENCE: json.loads(r[c.EVIDENCE])} for r in mine.iter_rows(named=True)]
        return {"type": "fleetlens.incident", "status": STATUS_PROVISIONAL, "incident": row,
                "causes": top, "phases": [], NOTE: incident.get(NOTE, "")}
    mine = causes.filter(pl.col(c.INCIDENT_ID) == incident[c.INCIDENT_ID]).sort(c.RANK)
    top = []
    for row in mine.head(TOP_CAUSES).iter_rows(named=True):
        row[c.EVIDENCE] = json.loads(row[c.EVIDENCE])
        top.append(row)
    # The `incident_phases` rows this run publishes (the same stage over the same causes),
    # as the incident page and `fleetlens explain` show them.
    phases = incident_phases(mine.lazy()).collect().drop(c.INCIDENT_ID).to_dicts()
    return {"type": "fleetlens.incident", "incident": dict(incident), "causes": top,
            "phases": phases}


def signature_headers(secret: str, body: bytes, now_s: int | None = None) -> dict[str, str]:
    """HMAC-SHA256 headers for ``body``: the signature covers ``"{timestamp}." + body``, so a
    receiver that checks the timestamp's age also refuses replays."""
    stamp = str(int(time.time()) if now_s is None else now_s)
    mac = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: f"sha256={mac}"}


def rfc3339(ns: int) -> str:
    """A UTC RFC 3339 timestamp (what Alertmanager and PagerDuty parse)."""
    moment = dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def incident_link(dashboard_url: str | None, incident_id: str) -> str | None:
    """The dashboard's page of the incident, when ``dashboard_url`` is configured."""
    if not dashboard_url:
        return None
    return f"{dashboard_url.rstrip('/')}/incident?id={incident_id}"


def is_update(snapshot: dict[str, Any]) -> bool:
    """Whether a snapshot updates an incident posted before (:data:`UPDATE_TYPE`)."""
    return snapshot.get("type") == UPDATE_TYPE


def alert_key(snapshot: dict[str, Any]) -> str:
    """The id receivers know the alert by: an update's is the incident it updates."""
    return snapshot[c.INCIDENT_ID] if is_update(snapshot) else snapshot["incident"][c.INCIDENT_ID]


def summary(snapshot: dict[str, Any]) -> str:
    """One line: severity, metric, scope, peak against expected, top cause."""
    inc = snapshot["incident"]
    if snapshot.get("type") == SLO_ALERT_TYPE:
        return _slo_summary(inc)
    scope = "/".join(v for v in (inc[c.SERVICE_NAME], inc[c.HOST_NAME]) if v != _ANY) or "fleet"
    top = snapshot["causes"][0] if snapshot["causes"] else None
    if is_update(snapshot):
        first = summary(snapshot["provisional"]) if snapshot.get("provisional") else ""
        if snapshot["status"] == STATUS_WITHDRAWN:
            return f"withdrawn (not confirmed): {first}"
        return f"confirmed: {summary({**snapshot, 'type': 'fleetlens.incident'})}"
    if snapshot.get("status") == STATUS_PROVISIONAL:
        named = (f"likely cause {top[c.CAUSE]} ({top[c.SUBJECT]})" if top
                 else "cause not known yet")
        return (f"PROVISIONAL {inc[c.SEVERITY]} incident on {scope}: {named}; "
                f"{snapshot.get(NOTE, '')}")
    if str(inc.get(c.DETECTOR) or "").startswith(DETECTOR_PREFIX) and top:
        # a failure has no band to be above: what failed is the message
        return (f"{inc[c.SEVERITY]} failure on {scope}: {top[c.CAUSE]} ({top[c.SUBJECT]}): "
                f"{top[c.SUMMARY]}")
    ratio = inc[c.PEAK] / inc[c.EXPECTED] if inc[c.EXPECTED] else float("nan")
    line = (f"{inc[c.SEVERITY]} {inc[c.METRIC]} incident on {scope}: x{ratio:,.1f} the "
            f"expected value")
    if top:
        line += f"; top cause {top[c.CAUSE]} ({top[c.SUBJECT]}): {top[c.SUMMARY]}"
    return line


def _slo_summary(alert: dict[str, Any]) -> str:
    from fleetlens.analytics.slos.config import window_label

    left = alert.get(c.BUDGET_REMAINING)
    budget = "" if left is None else f"; {left:.0%} of the error budget left"
    return (f"{alert[c.SEVERITY]}: SLO {alert[c.SLO]} of {alert[c.SERVICE_NAME]} "
            f"({alert[c.OBJECTIVE]:.4g}) burns its error budget at "
            f"{alert[c.LONG_BURN_RATE]:,.1f}x over {window_label(alert[c.LONG_WINDOW_S])} and "
            f"{alert[c.SHORT_BURN_RATE]:,.1f}x over {window_label(alert[c.SHORT_WINDOW_S])} "
            f"(alert at {alert[c.FACTOR]:g}x){budget}")


def is_slo_alert(snapshot: dict[str, Any]) -> bool:
    """Whether a snapshot is an SLO burn-rate alert (not an incident)."""
    return snapshot.get("type") == SLO_ALERT_TYPE


def _top_cause(snapshot: dict[str, Any]) -> str:
    return snapshot["causes"][0][c.CAUSE] if snapshot["causes"] else "unknown"


def slack_body(snapshot: dict[str, Any], link: str | None) -> dict[str, Any]:
    """A Slack incoming-webhook message: plain ``text`` (notifications) and ``blocks``."""
    inc = snapshot["incident"]
    text = _slack_escape(f"fleetlens: {summary(snapshot)}")
    title = "fleetlens update" if is_update(snapshot) else "fleetlens incident"
    lines = [f"*{title}* `{_slack_escape(alert_key(snapshot))}`",
             _slack_escape(summary(snapshot)),
             f"since {rfc3339(inc[c.START_NS])}"]
    if link:
        lines.append(f"<{link}|Open in the dashboard>")
    return {"text": text, "blocks": [
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}]}


def _slack_escape(text: str) -> str:
    # Slack's three control characters; without this "<http://x|y>" in a name is a link.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def pagerduty_event(snapshot: dict[str, Any], action: str, routing_key: str,
                    link: str | None) -> dict[str, Any]:
    """A PagerDuty Events v2 ``trigger`` or ``resolve`` event, deduplicated on the id."""
    inc = snapshot["incident"]
    event: dict[str, Any] = {"routing_key": routing_key, "event_action": action,
                             "dedup_key": alert_key(snapshot)}
    if action == "resolve":
        return event
    host, service = inc[c.HOST_NAME], inc[c.SERVICE_NAME]
    event["payload"] = {
        "summary": summary(snapshot)[:1024],  # the API's limit
        "source": host if host != _ANY else (service if service != _ANY else "fleet"),
        "severity": _PD_SEVERITY.get(inc[c.SEVERITY], "error"),
        "timestamp": rfc3339(inc[c.START_NS]),
        "component": service, "group": inc[c.MODEL], "class": _top_cause(snapshot),
        "custom_details": {"incident": inc, "causes": [
            {k: cause[k] for k in (c.CAUSE, c.SUBJECT, c.SUMMARY, c.SHARE_OF_EXCESS)}
            for cause in snapshot["causes"]]},
    }
    event["client"] = "fleetlens"
    if link:
        event["client_url"] = link
        event["links"] = [{"href": link, "text": "fleetlens incident"}]
    return event


def alertmanager_alert(snapshot: dict[str, Any], resolved_ns: int | None,
                       link: str | None) -> dict[str, Any]:
    """One Alertmanager v2 alert; ``resolved_ns`` (the incident's end) sets ``endsAt``."""
    inc = snapshot["incident"]
    # an update keeps the labels it was first posted with: labels are the alert's identity
    # to Alertmanager, new ones would be a second alert (a second page)
    first = snapshot["provisional"] if is_update(snapshot) else snapshot
    if is_slo_alert(snapshot):  # the labels of the generated Prometheus rules' alerts
        labels = {"alertname": SLO_ALERT_NAME, c.ALERT_ID: inc[c.INCIDENT_ID],
                  "service": inc[c.SERVICE_NAME], "slo": inc[c.SLO],
                  "severity": inc[c.SEVERITY], "alert": inc[c.ALERT]}
    else:
        was = first["incident"]
        labels = {
            "alertname": ALERT_NAME, c.INCIDENT_ID: was[c.INCIDENT_ID],
            "cause": _top_cause(first), "service": was[c.SERVICE_NAME],
            "host": was[c.HOST_NAME], "severity": was[c.SEVERITY], "metric": was[c.METRIC],
        }
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": {"summary": summary(snapshot)},
        "startsAt": rfc3339(first["incident"][c.START_NS]),
    }
    if is_update(snapshot) or snapshot.get("status") == STATUS_PROVISIONAL:
        alert["annotations"]["status"] = snapshot["status"]
        if is_update(snapshot) and snapshot["status"] == STATUS_CONFIRMED:
            alert["annotations"]["confirmed_incident_id"] = inc[c.INCIDENT_ID]
            alert["annotations"]["confirmed_cause"] = _top_cause(snapshot)
    if link:
        alert["annotations"]["dashboard"] = link
        alert["generatorURL"] = link
    if resolved_ns is not None:
        alert["endsAt"] = rfc3339(resolved_ns)
    return alert


__all__ = ["FORMATS", "PROVISIONAL_DETECTOR", "RESOLVING", "SLO_ALERT_NAME", "SLO_ALERT_TYPE",
           "SLO_DETECTOR", "STATUS_CONFIRMED", "STATUS_PROVISIONAL", "STATUS_WITHDRAWN",
           "UPDATE_TYPE", "alert_key", "is_slo_alert", "is_update", "SIGNATURE_HEADER",
           "TIMESTAMP_HEADER", "alertmanager_alert",
           "incident_link", "native_body", "pagerduty_event", "rfc3339", "signature_headers",
           "slack_body", "summary"]
