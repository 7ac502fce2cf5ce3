"""The Prometheus rules shipped under deploy/prometheus/ (fleetlens' own recordings and
alerts, and the SLO rules `fleetlens slo --rules` generated) pass Prometheus' own checker,
``promtool check rules``, and their unit tests, ``promtool test rules``: the recordings
aggregate the exporter's per-host series across hosts, each alert fires when it should. The
example Prometheus and Alertmanager configurations pass ``promtool check config`` and
``amtool check-config``, and the Alertmanager one routes pages to the pager."""

from __future__ import annotations

import subprocess

import yaml

from tests.analytics.promservers import binary
from tests.conftest import REPO

RULES = REPO / "deploy" / "prometheus"
RULE_FILES = sorted(RULES.glob("*.yaml"))
TEST_FILES = sorted((RULES / "tests").glob("*.test.yaml"))


def promtool(*args: str) -> str:
    out = subprocess.run([binary("promtool"), *args], capture_output=True, text=True,
                         cwd=RULES / "tests", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_promtool_checks_every_rule_file() -> None:
    assert {p.name for p in RULE_FILES} >= {"fleetlens-rules.yaml", "fleetlens-slo-rules.yaml"}
    out = promtool("check", "rules", *map(str, RULE_FILES))
    assert out.count("SUCCESS") == len(RULE_FILES), out


def test_promtool_unit_tests_pass_and_cover_every_rule_file_and_alert() -> None:
    tested = {str((RULES / "tests" / f).resolve()) for t in TEST_FILES
              for f in yaml.safe_load(t.read_text())["rule_files"]}
    assert tested == {str(p.resolve()) for p in RULE_FILES}
    alerts = {r["alert"] for p in RULE_FILES for g in yaml.safe_load(p.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    exercised = {case["alertname"] for t in TEST_FILES for test in
                 yaml.safe_load(t.read_text())["tests"] for case in test.get("alert_rule_test", [])}
    assert alerts == exercised
    out = promtool("test", "rules", *(p.name for p in TEST_FILES))
    assert "FAILED" not in out and out.count("SUCCESS") == len(TEST_FILES), out


def test_the_example_configurations_are_valid_and_route_pages_to_the_pager() -> None:
    out = promtool("check", "config", str(RULES / "prometheus.example.yml"))
    assert "SUCCESS: 2 rule files found" in out
    amtool = binary("amtool")
    example = str(RULES / "alertmanager.example.yml")
    check = subprocess.run([amtool, "check-config", example], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    def receiver(*labels: str) -> str:
        out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={example}",
                              *labels], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert receiver("alertname=FleetlensIncident", "severity=critical") == "pager"
    assert receiver("alertname=FleetlensSLOBurnRate", "severity=page") == "pager"
    assert receiver("alertname=FleetlensIncident", "severity=minor") == "tickets"
    assert receiver("alertname=FleetlensDataStale", "severity=ticket") == "tickets"
