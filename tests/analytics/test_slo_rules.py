"""The generated Prometheus rules parse as YAML, match the configuration they came from, and
the example file under deploy/prometheus/ is what the generator makes of the example."""

from __future__ import annotations

import re

import yaml
from click.testing import CliRunner

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.slos.config import BurnRateAlert, LatencySlo, ServiceSlos, SloConfig
from fleetlens.analytics.slos.rules import BAD_EVENTS, EVENTS, ratio_record, rules_yaml
from fleetlens.analytics.webhook_formats import SLO_ALERT_NAME
from fleetlens.cli import cli
from fleetlens.pipeline.schema.settings import load_section
from tests.conftest import REPO

EXAMPLE = REPO / "deploy" / "prometheus"
CONFIG = SloConfig(services=(
    ServiceSlos("llama", 0.999, (LatencySlo("ttft", 1.0, 0.99),)),
    ServiceSlos("qwen", 0.995)), period_days=28)


def rules_of(doc: dict, group_prefix: str) -> list[dict]:
    return [r for g in doc["groups"] if g["name"].startswith(group_prefix) for r in g["rules"]]


def test_one_recording_per_slo_and_window_over_the_exporter_counters() -> None:
    doc = yaml.safe_load(rules_yaml(CONFIG))
    records = rules_of(doc, "fleetlens-slo-sli-recordings-")
    windows = ["5m", "30m", "1h", "6h", "3d", "28d"]
    got = {(r["labels"]["service"], r["labels"]["slo"], r["labels"]["window"]) for r in records}
    assert got == {(s, n, w) for s, n in (("llama", "availability"), ("llama", "ttft_1s"),
                                          ("qwen", "availability")) for w in windows}
    five = next(r for r in records if r["labels"] == {"service": "qwen", "slo": "availability",
                                                      "window": "5m"})
    assert five["record"] == ratio_record("5m")
    assert f'{BAD_EVENTS}{{service="qwen", slo="availability"}}[5m]' in five["expr"]
    assert f'{EVENTS}{{service="qwen", slo="availability"}}[5m]' in five["expr"]


def test_alerts_are_multiwindow_with_the_configured_factors() -> None:
    doc = yaml.safe_load(rules_yaml(CONFIG))
    alerts = rules_of(doc, "fleetlens-slo-alerts-qwen-availability")
    assert {a["labels"]["severity"] for a in alerts} == {"page", "ticket"}
    assert all(a["alert"] == SLO_ALERT_NAME for a in alerts)
    page = next(a for a in alerts if a["labels"]["severity"] == "page")["expr"]
    # each rule: both of its windows above factor x budget (0.005), the two rules or-ed
    assert re.search(r"ratio_rate1h\{[^}]*\} > \(14\.4 \* 0\.005\).*\n\s*and\n.*"
                     r"ratio_rate5m\{[^}]*\} > \(14\.4 \* 0\.005\)", page)
    assert re.search(r"ratio_rate6h.*> \(6 \* 0\.005\).*\n\s*and\n.*ratio_rate30m.*"
                     r"> \(6 \* 0\.005\)", page)
    assert page.count("\nor\n") == 1
    meta = rules_of(doc, "fleetlens-slo-meta-recordings-llama-ttft_1s")
    assert {m["record"]: m["expr"] for m in meta}["fleetlens_slo:objective:ratio"] == \
        "vector(0.99)"


def test_custom_alert_rules_change_the_generated_alerts() -> None:
    config = SloConfig(services=CONFIG.services[1:], alerts=(
        BurnRateAlert("ticket", 2.0, 7200, 600),))
    alerts = rules_of(yaml.safe_load(rules_yaml(config)), "fleetlens-slo-alerts-")
    assert [a["labels"]["severity"] for a in alerts] == ["ticket"]
    assert "ratio_rate2h" in alerts[0]["expr"] and "(2 * 0.005)" in alerts[0]["expr"]


def test_the_example_file_is_generated_from_the_example_config(tmp_path) -> None:  # noqa: ANN001
    config = load_section(AnalyticsConfig, "analytics", EXAMPLE / "slos.example.toml",
                          environ={})
    example = (EXAMPLE / "fleetlens-slo-rules.yaml").read_text()
    assert example == rules_yaml(config.slos)
    out = CliRunner().invoke(cli, ["slo", "--config", str(EXAMPLE / "slos.example.toml"),
                                   "--rules"])
    assert out.exit_code == 0 and out.stdout == example
    services = {r["labels"]["service"] for g in yaml.safe_load(example)["groups"]
                for r in g["rules"]}
    assert services == {"llama-70b", "qwen-7b"}
