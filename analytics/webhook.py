"""Deliver incidents to webhooks, each webhook with its own delivery state.

State (``state/analytics/deliveries.json``): the incidents ever seen, and per webhook (keyed
by its URL and format) a queue of pending events (``trigger``, and ``resolve`` for formats
that take it) and the incidents it has open. An incident seen for the first time is queued
for every configured webhook; each webhook then works through its own queue, so a failing
hook retries only its own events instead of re-posting every incident to all the others.

- A retryable failure (network, deadline, 5xx, 429) stops that hook's queue for this run;
  the events stay queued, in order, for the next run (at least once: receivers deduplicate
  on the incident id).
- A permanent failure (other 4xx, a refused redirect) drops that event with an error: it
  would fail the same way again.
- A webhook added later gets incidents seen from then on; a removed one's queue is dropped.
- An incident *ends* when ``merge_gap_s`` of data has passed its last anomalous window
  without it growing (a later anomaly would be a new incident), or when it is no longer
  among the analysed incidents.
- Provisional incidents (live runs only, ``provisional`` given: :mod:`analytics.provisional`)
  are queued like incidents when first seen; the analysed incident that confirms one is not
  triggered but queued as an ``update`` of it, and a withdrawn one is an ``update``
  (native, Slack) or a ``resolve`` (PagerDuty, Alertmanager); a confirmed one ends when its
  confirming incident does. Bodies of these posts are kept in the state (``bodies``) so a
  retry sends what was queued (:mod:`analytics.webhook_updates`).

:func:`notify_new` runs outside the data directory's job lock (a slow webhook must not hold
the pipeline up) and under its own lock, so two ``analyze`` processes do not both post. On an
object store that lock is a lease: a run that stalls past it and loses it to another
``analyze`` posts nothing more and writes no delivery state (``LeaseLost`` before each post and
each write); its undelivered events stay queued for the new holder (at least once).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from fleetlens.analytics.analyse import Analysis
from fleetlens.analytics.config import AnalyticsConfig, WebhookConfig
from fleetlens.analytics.provenance import read_json, write_json_atomic
from fleetlens.analytics.provisional.gauges import Candidate
from fleetlens.analytics.provisional.guess import Guess
from fleetlens.analytics.provisional.lifecycle import DETECTOR as PROVISIONAL_DETECTOR
from fleetlens.analytics.provisional.lifecycle import View, advance
from fleetlens.analytics.webhook_formats import RESOLVING, SLO_DETECTOR, native_body
from fleetlens.analytics.webhook_http import redact_url
from fleetlens.analytics.webhook_send import UPDATE, send
from fleetlens.analytics.webhook_updates import confirmed_body, withdrawn_body
from fleetlens.pipeline.joblock import file_lock
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
STATE_FILE = "deliveries.json"
LOCK_FILE = "deliveries.lock"
#: Before per-webhook state: the ids of incidents delivered to every webhook.
LEGACY_FILE = "notified.json"
TRIGGER, RESOLVE = "trigger", "resolve"


def hook_key(hook: WebhookConfig) -> str:
    """A webhook's state key: stable across restarts and secret rotation, not the URL."""
    return hashlib.sha256(f"{hook.format}\n{hook.url}".encode()).hexdigest()[:16]


def _delivery_lock(folder: Path) -> contextlib.AbstractContextManager[Callable[[], None]]:
    # a flock in a local data directory, a lease object on an object store; the value is the
    # check to run before each post and state write (raises LeaseLost once the lease is lost)
    return file_lock(folder / LOCK_FILE, "webhooks")


def _load(folder: Path) -> dict[str, Any]:
    state = read_json(folder / STATE_FILE, None)
    if state is None:  # first run with per-webhook state: what was delivered stays delivered
        state = {"seen": read_json(folder / LEGACY_FILE, []), "hooks": {}}
    return state


def data_end_ns(analysis: Analysis) -> int | None:
    """The end of the analysed data (the last window's end), or ``None`` without windows."""
    if not analysis.banded.height or not analysis.window_s:
        return None
    return int(analysis.banded[c.TS_NS].max()) + analysis.window_s * NS


def notify_new(folder: Path, analysis: Analysis, config: AnalyticsConfig,
               echo: Callable[[str], None] | None = None,
               slo_alerts: list[dict[str, Any]] | None = None,
               provisional: list[tuple[Candidate, Guess]] | None = None,
               ) -> tuple[list[str], int, list[str]]:
    """Queue incidents seen for the first time and work through every webhook's queue.

    Args:
        folder: the analytics state folder.
        analysis: this run's incidents and causes.
        config: the webhooks, their deadline, ``merge_gap_s`` and ``dashboard_url``.
        echo: called with the native JSON of each incident seen for the first time.
        slo_alerts: SLO burn-rate alerts firing now, as incident-shaped rows
            (:func:`analytics.slos.report.alert_rows`): each is posted like an incident,
            once when it starts firing and (formats that resolve) once when it stops.
        provisional: the queues the engines' gauges show now (a live run:
            :func:`analytics.provisional.live.queues`); ``None`` leaves provisional
            incidents alone.

    Returns:
        (ids of incidents new or still undelivered somewhere, successful posts, errors).

    Raises:
        LeaseLost: on an object store, another process took the delivery lease over while
            this one stalled; nothing more was posted or written.
    """
    with _delivery_lock(folder) as still_held:
        state = _load(folder)
        current = {row[c.INCIDENT_ID]: row for row in analysis.incidents.iter_rows(named=True)}
        current.update({row[c.INCIDENT_ID]: row for row in slo_alerts or ()})
        causes = analysis.causes
        view = None
        if provisional is not None and config.provisional.enabled:
            still_held()
            view = advance(folder, provisional, analysis.incidents, config.provisional,
                           analysis.window_s or config.window_s, config.merge_gap_s,
                           data_end_ns(analysis))
            current.update(view.open)
            causes = pl.concat([causes, view.causes], how="diagonal_relaxed")
        seen = set(state["seen"])
        bodies: dict[str, dict[str, Any]] = state.get("bodies", {})
        aliases = {} if view is None else view.confirmed
        first = [i for i in current if i not in seen]
        hooks = {hook_key(h): h for h in config.hooks()}
        queues = {k: state["hooks"].get(k, {"pending": [], "open": {}}) for k in hooks}
        snapshots = {i: native_body(current[i], causes) for i in first}
        for ident in first:
            if any(f"{TRIGGER}:{p}" in bodies for p in aliases.get(ident, ())):
                continue  # it confirms a provisional incident: posted as its update
            _echo(echo, snapshots[ident])
            if current[ident].get(c.DETECTOR) == PROVISIONAL_DETECTOR:
                bodies[f"{TRIGGER}:{ident}"] = snapshots[ident]
            for queue in queues.values():
                queue["pending"].append([TRIGGER, ident])
        for prov, ident in ({} if view is None else view.newly_confirmed).items():
            if f"{TRIGGER}:{prov}" not in bodies or ident not in current:
                continue  # never posted (then its incident was, as itself)
            update = confirmed_body(bodies[f"{TRIGGER}:{prov}"], current[ident], causes)
            bodies[f"{UPDATE}:{prov}"] = update
            _echo(echo, update)
            for queue in queues.values():
                queue["pending"].append([UPDATE, prov])
        if view is not None:
            _withdraw(view, bodies, queues, hooks)
            for ident, provs in aliases.items():  # a confirmed one lasts as its incident
                current.update({p: current[ident] for p in provs})
        ended = _ended(current, data_end_ns(analysis), config.merge_gap_s)
        for key, queue in queues.items():
            if hooks[key].format in RESOLVING:
                _queue_resolves(queue, ended)
        undelivered = {i for q in queues.values() for a, i in q["pending"] if a == TRIGGER}
        live = {i for q in queues.values() for _, i in q["pending"]} | {
            i for q in queues.values() for i in q["open"]} | set(current)
        bodies = {k: v for k, v in bodies.items() if k.split(":", 1)[1] in live}
        state = {"seen": sorted(seen | set(first)), "hooks": queues, "bodies": bodies}
        still_held()
        write_json_atomic(folder / STATE_FILE, state)  # queued before any post
        posted, errors = 0, []
        for key, queue in queues.items():
            ok, failed = send(hooks[key], queue, current, causes, config, still_held, bodies)
            posted += ok
            errors += [f"{redact_url(hooks[key].url)} ({hooks[key].format}): {e}"
                       for e in failed]
            still_held()
            write_json_atomic(folder / STATE_FILE, state)
    return [i for i in current if i in undelivered or i in first], posted, errors


def _echo(echo: Callable[[str], None] | None, body: dict[str, Any]) -> None:
    if echo is not None:
        echo(json.dumps(body, sort_keys=True))


def _withdraw(view: View, bodies: dict[str, dict[str, Any]], queues: dict[str, Any],
              hooks: dict[str, WebhookConfig]) -> None:
    """Queue the withdrawal of each provisional incident withdrawn in this run: an update
    for hooks that do not resolve (those that do resolve it as it is no longer current);
    where its post is still queued, neither is sent."""
    for ident, row in view.withdrawn.items():
        first = bodies.get(f"{TRIGGER}:{ident}")
        if first is None:
            continue
        bodies[f"{UPDATE}:{ident}"] = withdrawn_body(first, row, view.confirm_within_s)
        for key, queue in queues.items():
            if [TRIGGER, ident] in queue["pending"]:
                queue["pending"].remove([TRIGGER, ident])
            elif hooks[key].format not in RESOLVING:
                queue["pending"].append([UPDATE, ident])


def _ended(current: dict[str, dict[str, Any]], end_ns: int | None, gap_s: int
           ) -> Callable[[str], bool]:
    def ended(ident: str) -> bool:
        row = current.get(ident)
        if row is None:
            return True  # recomputed away or older than the analysed history
        if row.get(c.DETECTOR) == SLO_DETECTOR:
            return False  # an SLO alert ends when it stops firing: it is then absent
        if row.get(c.DETECTOR) == PROVISIONAL_DETECTOR:
            return False  # ends when confirmed (as its incident) or withdrawn (absent)
        return end_ns is not None and row[c.END_NS] + gap_s * NS <= end_ns
    return ended


def _queue_resolves(queue: dict[str, Any], ended: Callable[[str], bool]) -> None:
    """Queue a resolve for each open or to-be-triggered incident that has ended."""
    queued = {(a, i) for a, i in queue["pending"]}
    candidates = list(queue["open"]) + [i for a, i in queue["pending"] if a == TRIGGER]
    for ident in candidates:
        if ended(ident) and (RESOLVE, ident) not in queued:
            queue["pending"].append([RESOLVE, ident])
            queued.add((RESOLVE, ident))


__all__ = ["data_end_ns", "hook_key", "notify_new"]
