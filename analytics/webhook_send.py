"""Work through one webhook's queue of events (see :mod:`analytics.webhook`).

``native``, ``slack`` and ``pagerduty`` get one post per event, in order; the first
retryable failure stops the queue for this run (a hook that is down costs one deadline per
run, not one per incident). ``alertmanager`` gets one post per run with every queued and
every still-open alert (firing alerts must be refreshed or Alertmanager resolves them).

An ``update`` event (a provisional incident confirmed or withdrawn,
:mod:`analytics.webhook_updates`) posts its stored body: native as is, Slack as a message,
PagerDuty as a ``trigger`` of the same ``dedup_key`` (confirmed only: a withdrawal reaches
PagerDuty and Alertmanager as their resolve), Alertmanager as the alert it updates.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig, WebhookConfig
from fleetlens.analytics.webhook_formats import (
    STATUS_CONFIRMED,
    STATUS_PROVISIONAL,
    STATUS_WITHDRAWN,
    alertmanager_alert,
    incident_link,
    is_slo_alert,
    native_body,
    pagerduty_event,
    signature_headers,
    slack_body,
)
from fleetlens.analytics.webhook_http import DeliveryError, post
from fleetlens.pipeline.schema import columns as c

TRIGGER, RESOLVE, UPDATE = "trigger", "resolve", "update"
_HEADERS = {"Content-Type": "application/json", "User-Agent": "fleetlens-analytics"}


def _no_check() -> None:
    """The default ``before_post``: nothing to confirm."""


def _link(snapshot: dict[str, Any], config: AnalyticsConfig) -> str | None:
    """The dashboard page of what a post is about: none for an SLO alert, nor for a
    provisional incident (live only: no page) or its withdrawal."""
    if is_slo_alert(snapshot) or snapshot.get("status") in (STATUS_PROVISIONAL,
                                                            STATUS_WITHDRAWN):
        return None
    return incident_link(config.dashboard_url, snapshot["incident"][c.INCIDENT_ID])


def _snapshot(action: str, ident: str, queue: dict[str, Any],
              current: dict[str, dict[str, Any]], causes: pl.DataFrame,
              bodies: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What an event posts: a stored body (provisional posts and updates), else the
    incident as analysed now (trigger) or as it was posted (resolve)."""
    stored = bodies.get(f"{action}:{ident}")
    if stored is not None or action == UPDATE:
        return stored
    if action == TRIGGER and ident in current:
        return native_body(current[ident], causes)
    return queue["open"].get(ident)


def send(hook: WebhookConfig, queue: dict[str, Any], current: dict[str, dict[str, Any]],
         causes: pl.DataFrame, config: AnalyticsConfig,
         before_post: Callable[[], None] = _no_check,
         bodies: dict[str, dict[str, Any]] | None = None) -> tuple[int, list[str]]:
    """Post ``queue["pending"]`` to ``hook``, updating ``queue`` in place.

    ``before_post`` runs before every post (the delivery lock's check: it raises
    ``LeaseLost`` once another process holds the lock, and the post is not made).
    ``bodies``: stored bodies by ``"action:id"`` (provisional posts and their updates).

    Returns:
        (successful posts, error messages without the URL).
    """
    bodies = bodies or {}
    if hook.format == "alertmanager":
        return _send_alertmanager(hook, queue, current, causes, config, before_post, bodies)
    posted, errors = 0, []
    while queue["pending"]:
        action, ident = queue["pending"][0]
        snapshot = _snapshot(action, ident, queue, current, causes, bodies)
        if snapshot is None or (action == UPDATE and hook.format == "pagerduty"
                                and snapshot["status"] != STATUS_CONFIRMED):
            # gone from the data before it was posted, or never opened; a withdrawal
            # reaches PagerDuty as the resolve of what it no longer sees
            queue["pending"].pop(0)
            continue
        link = _link(snapshot, config)
        if hook.format == "slack":
            body: Any = slack_body(snapshot, link)
        elif hook.format == "pagerduty":  # an update is a trigger of the same dedup_key
            body = pagerduty_event(snapshot, RESOLVE if action == RESOLVE else TRIGGER,
                                   hook.routing_key or "", link)
        else:
            body = snapshot
        before_post()
        try:
            _post(hook, body, config.webhook_timeout_s)
        except DeliveryError as exc:
            if exc.retryable:
                errors.append(f"{exc} (will retry)")
                break
            errors.append(f"{exc}; incident {ident} {action} dropped, not retried")
            if action == RESOLVE:  # or the next run would queue the same resolve again
                queue["open"].pop(ident, None)
        else:
            posted += 1
            if hook.format == "pagerduty":
                if action in (TRIGGER, UPDATE):
                    queue["open"][ident] = snapshot
                else:
                    queue["open"].pop(ident, None)
        queue["pending"].pop(0)
    return posted, errors


def _send_alertmanager(hook: WebhookConfig, queue: dict[str, Any],
                       current: dict[str, dict[str, Any]], causes: pl.DataFrame,
                       config: AnalyticsConfig, before_post: Callable[[], None],
                       bodies: dict[str, dict[str, Any]]) -> tuple[int, list[str]]:
    resolving = {i for a, i in queue["pending"] if a == RESOLVE}
    snapshots: dict[str, dict[str, Any]] = dict(queue["open"])
    for action, ident in queue["pending"]:
        if action == TRIGGER and (ident in current or f"{TRIGGER}:{ident}" in bodies):
            snapshots[ident] = _snapshot(action, ident, queue, current, causes, bodies)
        elif (action == UPDATE and f"{UPDATE}:{ident}" in bodies
              and bodies[f"{UPDATE}:{ident}"]["status"] == STATUS_CONFIRMED):
            snapshots[ident] = bodies[f"{UPDATE}:{ident}"]  # same labels, new annotations
    if not snapshots:
        queue["pending"].clear()
        return 0, []
    alerts = []
    for ident, snapshot in snapshots.items():
        end_ns = None
        if ident in resolving:
            row = current.get(ident, snapshot["incident"])
            end_ns = row[c.END_NS]
        link = _link(snapshot, config)
        alerts.append(alertmanager_alert(snapshot, end_ns, link))
    before_post()
    try:
        _post(hook, alerts, config.webhook_timeout_s)
    except DeliveryError as exc:
        if exc.retryable:
            return 0, [f"{exc} (will retry)"]
        queue["pending"].clear()
        queue["open"].clear()  # or every later run would re-send them, failing the same way
        return 0, [f"{exc}; {len(alerts)} alert(s) dropped, not retried"]
    queue["open"] = {i: s for i, s in snapshots.items() if i not in resolving}
    queue["pending"].clear()
    return 1, []


def _post(hook: WebhookConfig, body: Any, deadline_s: float) -> None:
    data = json.dumps(body, sort_keys=True).encode()
    headers = dict(_HEADERS)
    if hook.secret:
        headers.update(signature_headers(hook.secret, data))
    post(hook.url, data, headers, deadline_s)


__all__ = ["send"]
