"""`[analytics.slos]` in fleetlens.toml: loaded into frozen dataclasses, the workbook's alert
rules by default, and every bad value refused naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.slos.config import BurnRateAlert, LatencySlo, ServiceSlos, SloConfig
from fleetlens.pipeline.schema.settings import ConfigError, load_section


def load(tmp_path: Path, text: str) -> AnalyticsConfig:
    path = tmp_path / "fleetlens.toml"
    path.write_text(f"[analytics.slos]\n{text}\n")
    return load_section(AnalyticsConfig, "analytics", path, environ={})


def test_defaults_have_no_slos_and_the_workbook_alerts() -> None:
    config = AnalyticsConfig().slos
    assert config.services == () and config.period_days == 30
    assert [(a.severity, a.factor, a.long_window_s, a.short_window_s) for a in config.alerts] \
        == [("page", 14.4, 3600, 300), ("page", 6.0, 21600, 1800),
            ("ticket", 1.0, 259200, 21600)]


def test_services_and_alerts_load_from_toml(tmp_path: Path) -> None:
    config = load(tmp_path, """
period_days = 28
[[analytics.slos.services]]
service = "llama-70b"
availability = 0.999
latency = [{metric = "ttft", threshold_s = 1, objective = 0.99},
           {metric = "e2e", threshold_s = 20, objective = 0.95, name = "e2e_fast"}]
[[analytics.slos.alerts]]
severity = "page"
factor = 10
long_window_s = 3600
short_window_s = 300
""").slos
    assert config.period_days == 28
    assert config.services == (ServiceSlos("llama-70b", 0.999, (
        LatencySlo("ttft", 1.0, 0.99), LatencySlo("e2e", 20.0, 0.95, "e2e_fast"))),)
    assert config.services[0].latency[0].slo_name() == "ttft_1s"
    assert config.alerts == (BurnRateAlert("page", 10.0, 3600, 300),)


@pytest.mark.parametrize("text,field", [
    ('[[analytics.slos.services]]\nservice = "s"\navailability = 1.0',
     "analytics.slos.services[0].availability"),
    ('[[analytics.slos.services]]\nservice = ""\navailability = 0.9',
     "analytics.slos.services[0].service"),
    ('[[analytics.slos.services]]\nservice = "s"', "analytics.slos.services[0].availability"),
    ('[[analytics.slos.services]]\nservice = "s"\n'
     'latency = [{metric = "p99", threshold_s = 1, objective = 0.9}]',
     "analytics.slos.services[0].latency[0].metric"),
    ('[[analytics.slos.services]]\nservice = "s"\n'
     'latency = [{metric = "ttft", threshold_s = 0, objective = 0.9}]',
     "analytics.slos.services[0].latency[0].threshold_s"),
    ('[[analytics.slos.alerts]]\nseverity = "sms"', "analytics.slos.alerts[0].severity"),
    ('[[analytics.slos.alerts]]\nlong_window_s = 300\nshort_window_s = 300',
     "analytics.slos.alerts[0].short_window_s"),
    ("period_days = 0", "analytics.slos.period_days"),
    ('[[analytics.slos.services]]\nservice = "s"\navailability = 0.9\n'
     '[[analytics.slos.services]]\nservice = "s"\navailability = 0.99',
     "analytics.slos.services[1].service"),
    ('[[analytics.slos.services]]\nservice = "s"\nobjective = 0.9',
     "analytics.slos.services[0].objective"),
])
def test_a_bad_value_names_its_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert str(caught.value).startswith(field), caught.value


def test_validate_names_the_field_without_loading() -> None:
    bad = SloConfig(services=(ServiceSlos("s", latency=(LatencySlo(objective=1.5),)),))
    with pytest.raises(ConfigError, match=r"^services\[0\]\.latency\[0\]\.objective"):
        bad.validate()
