"""fleetlens posts an incident to a real Alertmanager (Debian's 0.25, started here on
127.0.0.1), which routes it to a webhook receiver as firing, then as resolved once the
incident ended (issue 32, section 2): the ``alertmanager`` webhook format as Alertmanager
itself reads it, not as a test double expects it."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fleetlens.analytics.webhook_formats import ALERT_NAME
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir
from tests.analytics.promservers import alertmanager, wait_for
from tests.analytics.synthetic_io import write_tables
from tests.analytics.webhook_receiver import H, config_file, fleet, serve, until

DASHBOARD = "http://dashboard.example:8501"


def routed_to(url: str) -> dict:
    """alertmanager.yml: every alert to one webhook, at once, resolved ones too."""
    return {"route": {"receiver": "hook", "group_by": ["alertname", c.INCIDENT_ID],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "4h"},
            "receivers": [{"name": "hook", "webhook_configs": [
                {"url": url, "send_resolved": True}]}]}


def analyze(root: DataDir, cfg: Path) -> None:
    out = CliRunner().invoke(cli, ["analyze", "--data-dir", str(root.root), "--config",
                                   str(cfg)])
    assert out.exit_code == 0 and "webhook failed" not in out.output, out.output


def notified(hook, status: str) -> list[dict]:  # noqa: ANN001
    """The alerts Alertmanager notified the hook of with ``status``."""
    return [a for p in hook.posts() for a in p.json()["alerts"]
            if a["status"] == status and a["labels"]["alertname"] == ALERT_NAME]


def test_an_incident_is_routed_by_alertmanager_then_resolved(tmp_path: Path) -> None:
    data = fleet()
    root = DataDir(tmp_path / "data")
    write_tables(until(data, 2 * H + 600), root)  # h01's incident is 10 minutes old
    with serve() as hook, alertmanager(tmp_path / "am", routed_to(hook.url("/am"))) as am:
        cfg = config_file(tmp_path, f'dashboard_url = "{DASHBOARD}"\nwebhooks = [{{url = '
                                    f'"{am.url}/api/v2/alerts", format = "alertmanager"}}]')
        analyze(root, cfg)
        (firing,) = wait_for(lambda: notified(hook, "firing"), "the firing notification", am)
        labels = firing["labels"]
        assert (labels["cause"], labels["service"], labels["host"]) == (
            "kv_cache_pressure", "chat", "h01")
        ident = labels[c.INCIDENT_ID]
        assert firing["annotations"]["dashboard"] == f"{DASHBOARD}/incident?id={ident}"
        assert firing["generatorURL"] == firing["annotations"]["dashboard"]
        assert firing["startsAt"].startswith("2026-01-01T02:00:00")
        # Alertmanager holds it as active
        (held,) = [a for a in am.get("/api/v2/alerts") if a["labels"][c.INCIDENT_ID] == ident]
        assert held["status"]["state"] == "active"

        write_tables(data, root)  # an hour later: it ended at 2:15
        analyze(root, cfg)
        (resolved,) = wait_for(lambda: notified(hook, "resolved"), "the resolution", am)
        assert resolved["labels"] == labels
        assert resolved["endsAt"].startswith("2026-01-01T02:1")
        assert not [a for a in am.get("/api/v2/alerts", active="true", silenced="false")
                    if a["labels"][c.INCIDENT_ID] == ident]
