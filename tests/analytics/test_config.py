from __future__ import annotations

from pathlib import Path

import pytest

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.config import load_config
from fleetlens.pipeline.schema.settings import ConfigError


def test_analytics_section_is_wired(tmp_path: Path) -> None:
    path = tmp_path / "fleetlens.toml"
    path.write_text("""
[analytics]
window_s = 10
slo_rules = ["p99(e2e) > 850 ms", "p99(ttft) > 200 ms for 10 s"]
webhooks = ["http://127.0.0.1:9/hook"]
group_by = ["region", "model"]
[analytics.sla]
ttft_p99_s = 0.3
""")
    cfg = load_config(path, environ={})
    assert isinstance(cfg.analytics, AnalyticsConfig)
    assert cfg.analytics.window_s == 10
    assert cfg.analytics.slo_rules[1] == "p99(ttft) > 200 ms for 10 s"
    assert cfg.analytics.sla == {"ttft_p99_s": 0.3}
    assert load_config(None, environ={}).analytics == AnalyticsConfig()


@pytest.mark.parametrize("text,field", [
    ('slo_rules = ["p99(e2e) > fast"]', "analytics.slo_rules"),
    ('webhooks = ["ftp://x"]', "analytics.webhooks"),
    ("band_k = 0", "analytics.band_k"),
    ('detect_metrics = ["rps"]', "analytics.detect_metrics"),
    ("consecutive = 0", "analytics.consecutive"),
    ("confirm_min_score = 2", "analytics.confirm_min_score"),
    ("confirm_min_e2e_rise = -0.1", "analytics.confirm_min_e2e_rise"),
    ("unpoison_passes = 0", "analytics.unpoison_passes"),
    ('corroborated_metrics = ["ttft_p50_s:hit_rate"]', "analytics.corroborated_metrics"),
    ("corroborated_signal_drop = 1.5", "analytics.corroborated_signal_drop"),
    ("clock_corroborated_drop = 0", "analytics.clock_corroborated_drop"),
    ('clock_corroborated_metrics = ["rps"]', "analytics.clock_corroborated_metrics"),
    ("windw_s = 5", "analytics.windw_s"),
])
def test_bad_values_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "fleetlens.toml"
    path.write_text(f"[analytics]\n{text}\n")
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(path, environ={})
