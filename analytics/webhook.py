"""Post new incidents as JSON to webhooks (and a line to stdout).

An incident is *new* until it has been delivered: its id is added to the ``notified`` state
file only after every webhook answered 2xx, so a webhook that is down gets the incident on
a later run (at least once; receivers deduplicate on ``incident_id``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.provenance import read_json, write_json_atomic
from fleetlens.pipeline.schema import columns as c

#: Causes included in a webhook payload.
TOP_CAUSES = 3


def payload(incident: dict[str, Any], causes: pl.DataFrame) -> dict[str, Any]:
    """The JSON body posted for one incident: its row plus its top causes."""
    mine = causes.filter(pl.col(c.INCIDENT_ID) == incident[c.INCIDENT_ID]).sort(c.RANK)
    top = []
    for row in mine.head(TOP_CAUSES).iter_rows(named=True):
        row[c.EVIDENCE] = json.loads(row[c.EVIDENCE])
        top.append(row)
    return {"type": "fleetlens.incident", "incident": incident, "causes": top}


def post_json(url: str, body: dict[str, Any], timeout_s: float) -> None:
    """POST ``body`` as JSON; raises ``OSError`` (URLError/HTTPError) unless 2xx."""
    data = json.dumps(body, sort_keys=True).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "fleetlens-analytics"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        if not 200 <= response.status < 300:
            raise urllib.error.HTTPError(url, response.status, "not 2xx", response.headers,
                                         None)


def notify_new(state_file: Path, incidents: pl.DataFrame, causes: pl.DataFrame,
               config: AnalyticsConfig, echo: Callable[[str], None] | None = None
               ) -> tuple[list[str], int, list[str]]:
    """Deliver incidents not delivered before.

    Returns:
        (ids of new incidents, number of successful posts, error messages).
    """
    done = set(read_json(state_file, []))
    new = [row for row in incidents.iter_rows(named=True) if row[c.INCIDENT_ID] not in done]
    posted, errors = 0, []
    for row in new:
        body = payload(row, causes)
        if echo is not None:
            echo(json.dumps(body, sort_keys=True))
        ok = True
        for url in config.webhooks:
            try:
                post_json(url, body, config.webhook_timeout_s)
                posted += 1
            except (OSError, ValueError) as exc:
                ok = False
                errors.append(f"{url}: {exc}")
        if ok:
            done.add(row[c.INCIDENT_ID])
    if new:
        write_json_atomic(state_file, sorted(done))
    return [r[c.INCIDENT_ID] for r in new], posted, errors
