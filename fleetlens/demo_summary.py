"""What ``fleetlens demo`` says at the end: what it injected, what analytics found, and the
commands to run next, with the demo's data directory in each.

Read back from the data directory (the stored ``incidents`` and ``causes`` tables and the
simulator's ground truth), never from the run that made them, so a second ``fleetlens
demo`` that reuses the data prints the same summary as the first.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path


def _top_causes(root: Path) -> tuple[list[dict], dict[str, dict]]:
    """The incidents, oldest first, and each one's first-ranked cause (by incident id)."""
    import polars as pl

    from fleetlens.analytics.runner import read_table
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import DataDir

    data = DataDir(root)
    incidents = read_table(data, t.INCIDENTS).sort(c.START_NS, c.INCIDENT_ID)
    causes = read_table(data, t.CAUSES).filter(pl.col(c.RANK) == 1)
    top = {row[c.INCIDENT_ID]: row for row in causes.iter_rows(named=True)}
    return incidents.to_dicts(), top


def summary_lines(root: Path, data_dir: str) -> list[str]:
    """The summary, one string per line; ``data_dir`` as the user gave it (it is pasted
    into the next commands, run from the same directory)."""
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.terminal import plain

    truth = root / "ground-truth.json"
    injected = json.loads(truth.read_text()).get("incidents", []) if truth.exists() else []
    incidents, top = _top_causes(root)
    lines = [f"injected: {item['cause']:<20} {item['subject']}" for item in injected]
    found = {(row[c.CAUSE], row[c.SUBJECT]) for row in top.values()}
    verdict = ""
    if injected:
        hits = sum((item["cause"], item["subject"]) in found for item in injected)
        verdict = (f" ({hits} of {len(injected)} injected found with the right top cause "
                   "and subject)")
    lines.append(f"found {len(incidents)} incident(s){verdict}:")
    for row in incidents:
        cause = top.get(row[c.INCIDENT_ID])
        scope = "/".join(v for v in (row[c.SERVICE_NAME], row[c.HOST_NAME]) if v != "*")
        what = f"{cause[c.CAUSE]} {cause[c.SUBJECT]}" if cause else "(no cause)"
        # Hosts and subjects come from telemetry: control characters shown escaped, not sent.
        lines.append(plain(f"  {row[c.INCIDENT_ID]}  {row[c.SEVERITY]:<8} "
                           f"{row[c.METRIC]:<12} {scope or 'fleet':<14} -> {what}"))
    where = shlex.quote(data_dir)
    lines += ["", "next:", f"  fleetlens incidents --data-dir {where}"]
    if incidents:
        lines.append(f"  fleetlens explain {incidents[0][c.INCIDENT_ID]} --data-dir {where}")
    return lines


def dashboard_lines(url: str, first_incident: str | None) -> list[str]:
    """Under the dashboard's URL: the page of the incident the summary's `explain` names."""
    if not first_incident:
        return []
    return [f"  the first incident's page: {url}/incident?id={first_incident}"]


def first_incident(root: Path) -> str | None:
    """The oldest incident's id (the one the summary's `explain` line names), if any."""
    from fleetlens.pipeline.schema import columns as c

    incidents, _ = _top_causes(root)
    return str(incidents[0][c.INCIDENT_ID]) if incidents else None
