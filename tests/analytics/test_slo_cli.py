"""`fleetlens slo` on a data directory written here: the SLOs of the configuration, their
compliance, budget left, burn rates and firing alerts, as table, JSON and CSV; `--rules`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.slo_data import config_file, write_requests
from tests.analytics.slo_frames import requests, spread

END = 8 * 60


@pytest.fixture
def setup(tmp_path: Path) -> tuple[str, str]:
    root = DataDir(tmp_path / "data")
    # 2% failing (20x the 0.1% budget) for the last 70 minutes, TTFT always fast
    write_requests(root, requests(END, spread(END - 70, END, 2)))
    return str(root.root), str(config_file(tmp_path))


def slo(*args: str) -> str:
    out = CliRunner().invoke(cli, ["slo", *args])
    assert out.exit_code == 0, out.output
    return out.stdout


def test_json_holds_each_slo_with_budget_burn_rates_and_alerts(setup: tuple[str, str]) -> None:
    data, cfg = setup
    rows = json.loads(slo("--data-dir", data, "--config", cfg, "--format", "json"))
    assert [(r[c.SERVICE_NAME], r[c.SLO]) for r in rows] == [("svc", "availability"),
                                                             ("svc", "ttft_1s")]
    avail, ttft = rows
    assert avail[c.OBJECTIVE] == 0.999 and avail[c.BAD_EVENTS] == 140
    assert avail[c.BUDGET_REMAINING] == 0.0  # 140 failed of 48 allowed
    assert avail["burn_rate_1h"] == pytest.approx(20.0)
    assert avail["burn_rate_5m"] == pytest.approx(20.0)
    assert {a[c.ALERT] for a in avail[t.SLO_ALERTS]} == {"page_1h_5m", "ticket_3d_6h"}
    assert ttft[c.BUDGET_REMAINING] == 1.0 and ttft[t.SLO_ALERTS] == []


def test_csv_and_table_carry_the_same_slos(setup: tuple[str, str]) -> None:
    data, cfg = setup
    rows = list(csv.DictReader(io.StringIO(slo("--data-dir", data, "--config", cfg,
                                               "--format", "csv"))))
    assert [r[c.SLO] for r in rows] == ["availability", "ttft_1s"]
    # oldest first: the ticket fired before the page
    assert rows[0][t.SLO_ALERTS] == "ticket_3d_6h (ticket); page_1h_5m (page)"
    table = slo("--data-dir", data, "--config", cfg)
    assert "availability" in table and "page_1h_5m (page)" in table
    assert "2 SLOs; compliance and budget over 3 days" in table


def test_without_slos_nothing_is_invented(tmp_path: Path, setup: tuple[str, str]) -> None:
    data, _ = setup
    bare = tmp_path / "bare.toml"
    bare.write_text("[analytics]\n")
    assert json.loads(slo("--data-dir", data, "--config", str(bare), "--format", "json",
                          "--refresh")) == []
    assert "no SLO is configured" in slo("--data-dir", data, "--config", str(bare))


def test_rules_are_printed_for_the_configured_slos(setup: tuple[str, str]) -> None:
    import yaml

    _, cfg = setup
    rules = yaml.safe_load(slo("--config", cfg, "--rules"))
    names = [g["name"] for g in rules["groups"]]
    assert "fleetlens-slo-alerts-svc-availability" in names
    assert "fleetlens-slo-alerts-svc-ttft_1s" in names
