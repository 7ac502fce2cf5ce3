"""Incidents to Alertmanager, Slack, PagerDuty Events v2 and the signed native webhook.

``fleetlens analyze`` runs over a data directory first while h01's incident is still going
on, then after it ended, delivering to real receivers on 127.0.0.1 that record what they get.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from pathlib import Path

from click.testing import CliRunner

from fleetlens.analytics.config import SEVERITIES
from fleetlens.cli import cli
from fleetlens.pipeline.storage import DataDir
from tests.analytics.synthetic_io import write_tables
from tests.analytics.webhook_receiver import H, config_file, fleet, serve, until

SECRET = "a-long-shared-secret-for-hmac"
DASHBOARD = "https://fleetlens.example:8501"
PD_SEVERITIES = {"critical", "error", "warning", "info"}


def _time(text: str) -> dt.datetime:
    assert text.endswith("Z"), text  # RFC 3339 in UTC
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _analyze(root: DataDir, cfg: Path) -> str:
    out = CliRunner().invoke(cli, ["analyze", "--data-dir", str(root.root), "--config",
                                   str(cfg)])
    assert out.exit_code == 0, out.output
    assert "webhook failed" not in out.output, out.output
    return out.output


def test_alertmanager_slack_pagerduty_and_signed_native(tmp_path: Path) -> None:
    data = fleet()
    root = DataDir(tmp_path / "data")
    write_tables(until(data, 2 * H + 600), root)  # h01's incident is 10 minutes old
    with serve() as am, serve() as slack, serve() as pd, serve() as native:
        cfg = config_file(tmp_path, "\n".join([
            f'dashboard_url = "{DASHBOARD}"',
            "webhooks = [",
            f'  {{url = "{am.url("/api/v2/alerts")}", format = "alertmanager"}},',
            f'  {{url = "{slack.url("/services/T0/B0/x")}", format = "slack"}},',
            f'  {{url = "{pd.url("/v2/enqueue")}", format = "pagerduty", '
            'routing_key = "R0UTINGKEY0123456789abcdef0123"},',
            f'  {{url = "{native.url()}", secret = "{SECRET}"}},',
            "]"]))
        _analyze(root, cfg)
        _analyze(root, cfg)  # still going on: Alertmanager is refreshed, nobody else is told
        write_tables(data, root)  # an hour later: it ended at 2:15
        _analyze(root, cfg)
        _analyze(root, cfg)  # nothing left to say

        # --- Alertmanager v2: POST /api/v2/alerts, a list of alerts -------------------
        posts = am.posts()
        assert [p.path for p in posts] == ["/api/v2/alerts"] * 3
        assert all(p.headers["Content-Type"] == "application/json" for p in posts)
        firing, refreshed, resolved = (p.json() for p in posts)
        assert len(firing) == 1 and refreshed == firing
        alert = firing[0]
        labels = alert["labels"]
        assert {"alertname", "cause", "service", "host", "severity"} <= set(labels)
        assert all(isinstance(v, str) and v for v in labels.values())
        assert (labels["cause"], labels["service"], labels["host"]) == (
            "kv_cache_pressure", "chat", "h01")
        assert labels["severity"] in SEVERITIES
        ident = labels["incident_id"]
        assert alert["annotations"]["dashboard"] == f"{DASHBOARD}/incident?id={ident}"
        assert "kv_cache_pressure" in alert["annotations"]["summary"]
        assert alert["generatorURL"] == alert["annotations"]["dashboard"]
        assert "endsAt" not in alert
        start = _time(alert["startsAt"])
        assert start == dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.UTC)
        (done,) = resolved
        assert done["labels"] == labels  # the same alert, now resolved
        assert _time(done["endsAt"]) > start and _time(done["endsAt"]).hour == 2

        # --- PagerDuty Events v2: trigger, then resolve with the same dedup_key --------
        events = [p.json() for p in pd.posts()]
        assert [e["event_action"] for e in events] == ["trigger", "resolve"]
        trigger, resolve = events
        assert trigger["routing_key"] == resolve["routing_key"] == (
            "R0UTINGKEY0123456789abcdef0123")
        assert trigger["dedup_key"] == resolve["dedup_key"] == ident
        payload = trigger["payload"]
        assert payload["summary"] and len(payload["summary"]) <= 1024
        assert payload["source"] == "h01" and payload["severity"] in PD_SEVERITIES
        assert _time(payload["timestamp"]) == start
        assert trigger["links"] == [{"href": f"{DASHBOARD}/incident?id={ident}",
                                     "text": "fleetlens incident"}]

        # --- Slack: one message, text plus blocks ------------------------------------
        (message,) = [p.json() for p in slack.posts()]
        assert isinstance(message["text"], str) and "kv_cache_pressure" in message["text"]
        section = message["blocks"][0]
        assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
        assert ident in section["text"]["text"]
        assert f"<{DASHBOARD}/incident?id={ident}|" in section["text"]["text"]

        # --- native: the fleetlens JSON, HMAC-signed -----------------------------------
        (signed,) = native.posts()
        stamp = signed.headers["X-Fleetlens-Timestamp"]
        want = hmac.new(SECRET.encode(), stamp.encode() + b"." + signed.body,
                        hashlib.sha256).hexdigest()
        assert signed.headers["X-Fleetlens-Signature"] == f"sha256={want}"
        body = signed.json()
        assert body["type"] == "fleetlens.incident" and body["incident"]["incident_id"] == ident


def test_slack_text_cannot_forge_links(tmp_path: Path) -> None:
    from fleetlens.analytics.webhook_formats import slack_body

    snapshot = {"incident": {
        "incident_id": "abc", "metric": "e2e_p99_s", "service_name": "<https://evil|click>",
        "host_name": "h&1", "start_ns": 0, "end_ns": 0, "peak": 2.0, "expected": 1.0,
        "severity": "major", "model": "m"}, "causes": []}
    body = slack_body(snapshot, None)
    assert "<https://evil" not in body["text"] and "&lt;https://evil|click&gt;" in body["text"]
    assert "h&amp;1" in body["blocks"][0]["text"]["text"]
