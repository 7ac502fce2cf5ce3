"""Updates of an incident already posted: a provisional incident confirmed or withdrawn.

A provisional incident (:mod:`analytics.provisional`) is posted from the engines' gauges
before its slow requests end. What the receivers get next is an *update* of that post, never
a second page:

```json
{"type": "fleetlens.incident_update", "incident_id": "<the provisional id>",
 "status": "confirmed" | "withdrawn",
 "provisional": {<the provisional post's native body>},
 "incident": {<confirmed: the analysed incident's row; withdrawn: the provisional row>},
 "causes": [<its top causes, evidence parsed>], "phases": [...],
 "reason": "<withdrawn: why>"}
```

Per format (:mod:`analytics.webhook_send`): native gets the body as is; Slack a message
titled "fleetlens update"; PagerDuty a ``trigger`` with the provisional id as
``dedup_key`` (PagerDuty adds it to the open alert), then ``resolve`` when the confirmed
incident ends or the provisional one is withdrawn; Alertmanager the alert with its first
labels and new annotations (``status``, ``confirmed_incident_id``, ``confirmed_cause``,
``summary``), resolved the same way.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleetlens.analytics.webhook_formats import (
    STATUS_CONFIRMED,
    STATUS_WITHDRAWN,
    UPDATE_TYPE,
    native_body,
)
from fleetlens.pipeline.schema import columns as c


def confirmed_body(provisional: dict[str, Any], incident: dict[str, Any],
                   causes: pl.DataFrame) -> dict[str, Any]:
    """The update saying that the provisional post ``provisional`` is ``incident``."""
    body = native_body(incident, causes)
    return {**body, "type": UPDATE_TYPE, "status": STATUS_CONFIRMED,
            c.INCIDENT_ID: provisional["incident"][c.INCIDENT_ID], "provisional": provisional}


def withdrawn_body(provisional: dict[str, Any], row: dict[str, Any],
                   within_s: float) -> dict[str, Any]:
    """The update withdrawing the provisional post ``provisional`` (its last ``row``)."""
    return {"type": UPDATE_TYPE, "status": STATUS_WITHDRAWN,
            c.INCIDENT_ID: provisional["incident"][c.INCIDENT_ID],
            "provisional": provisional, "incident": {**provisional["incident"], **{
                k: row[k] for k in (c.END_NS, c.PEAK) if k in row}},
            "causes": provisional["causes"], "phases": [],
            "reason": f"no latency or failure incident on its scope within {within_s:g} s "
                      "of its start"}


__all__ = ["confirmed_body", "withdrawn_body"]
