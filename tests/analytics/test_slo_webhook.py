"""SLO burn-rate alerts through `fleetlens analyze` to real receivers on 127.0.0.1: posted
once when they start firing, resolved once when they stop, in the Alertmanager and native
formats (the incidents' delivery machinery, not a second sender)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fleetlens.analytics.webhook_formats import SLO_ALERT_NAME
from fleetlens.cli import cli
from fleetlens.pipeline.storage import DataDir
from tests.analytics.slo_data import config_file, write_requests
from tests.analytics.slo_frames import requests, spread
from tests.analytics.webhook_receiver import serve

END = 8 * 60


def analyze(root: DataDir, cfg: Path) -> str:
    out = CliRunner().invoke(cli, ["analyze", "--data-dir", str(root.root), "--config",
                                   str(cfg)])
    assert out.exit_code == 0 and "webhook failed" not in out.output, out.output
    return out.output


def page_alerts(posts: list) -> list[dict]:  # noqa: ANN001
    return [a for p in posts for a in p.json()
            if a["labels"]["alertname"] == SLO_ALERT_NAME
            and a["labels"]["severity"] == "page"]


def test_a_firing_alert_reaches_alertmanager_and_is_resolved_once(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "data")
    # 2% failing for the last 70 minutes: 20x the budget over 1 h and 5 min
    write_requests(root, requests(END, spread(END - 70, END, 2)))
    with serve() as am:
        cfg = config_file(tmp_path, f'webhooks = [{{url = "{am.url("/api/v2/alerts")}", '
                                    'format = "alertmanager"}]')
        analyze(root, cfg)
        fired = page_alerts(am.posts())
        assert len(fired) == 1, fired
        alert = fired[0]
        assert alert["labels"]["service"] == "svc" and alert["labels"]["slo"] == "availability"
        assert alert["labels"]["alert"] == "page_1h_5m" and "endsAt" not in alert
        assert "20.0x over 1h" in alert["annotations"]["summary"]
        analyze(root, cfg)  # still firing: refreshed (Alertmanager's way), same alert
        assert [a["labels"] for a in page_alerts(am.posts())] == [alert["labels"]] * 2
        assert all("endsAt" not in a for a in page_alerts(am.posts()))
        # 10 clean minutes later the 5-minute burn is 0: the page stops
        write_requests(root, requests(END + 10)[END * 100:], name="later.parquet")
        analyze(root, cfg)
        resolved = [a for a in page_alerts(am.posts()) if "endsAt" in a]
        assert len(resolved) == 1 and resolved[0]["labels"] == alert["labels"]
        analyze(root, cfg)
        assert len([a for a in page_alerts(am.posts()) if "endsAt" in a]) == 1


def test_a_native_hook_gets_each_alert_once(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "data")
    write_requests(root, requests(END, spread(END - 70, END, 2)))
    with serve() as hook:
        cfg = config_file(tmp_path, f'webhooks = ["{hook.url()}"]')
        analyze(root, cfg)
        analyze(root, cfg)
        bodies = [p.json() for p in hook.posts()]
        # two runs, each alert posted once
        assert sorted(b["incident"]["alert"] for b in bodies) == ["page_1h_5m", "ticket_3d_6h"]
        assert all(b["type"] == "fleetlens.slo_alert" for b in bodies)
