"""The ``[agent]`` config table: defaults, TOML, environment, CLI overrides, named errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetlens.collector.agent.cli import load_agent_config, parse_vllm_option
from fleetlens.collector.agent.config import AgentConfig, VllmTarget
from fleetlens.pipeline.schema.settings import ConfigError


def test_defaults() -> None:
    cfg = load_agent_config(None, environ={})
    assert cfg == AgentConfig()
    assert (cfg.collector, cfg.gpu_interval_s, cfg.scrape_interval_s) == ("127.0.0.1:4317",
                                                                         0.1, 1.0)
    assert cfg.service_name == "fleetlens-agent" and not cfg.uses_tls


def test_file_env_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "fleetlens.toml"
    path.write_text("""
[agent]
collector = "collector.internal:4317"
tls = true
gpu_interval_s = 0.5
resource_attributes = { region = "eu-west" }
[[agent.vllm]]
url = "http://127.0.0.1:8000"
instance_id = "h/llama-0"
gpus = ["0", "1"]
[[agent.vllm]]
url = "http://127.0.0.1:8001/metrics"
service_name = "llama-1"
""")
    cfg = load_agent_config(str(path), environ={"FLEETLENS_AGENT__AUTH_TOKEN": "t0k"})
    assert cfg.uses_tls and cfg.auth_token == "t0k" and cfg.gpu_interval_s == 0.5
    assert cfg.resource_attributes == {"region": "eu-west"}
    first, second = cfg.vllm
    assert first.gpus == ("0", "1") and first.metrics_url == "http://127.0.0.1:8000/metrics"
    assert second.metrics_url == "http://127.0.0.1:8001/metrics"
    assert second.resolved_instance_id("gpu-07") == "gpu-07/llama-1"
    over = load_agent_config(str(path), {"vllm": [{"url": "http://127.0.0.1:9"}],
                                         "gpu_interval_s": 0.2}, environ={})
    assert over.vllm == (VllmTarget(url="http://127.0.0.1:9"),) and over.gpu_interval_s == 0.2


@pytest.mark.parametrize("text,field", [
    ("collector = 'nohost'", "agent.collector"),
    ("collector = '10.0.0.5:4317'", "agent.allow_plaintext"),
    ("gpu_interval_s = 0", "agent.gpu_interval_s"),
    ("gpu_intervall_s = 1", "agent.gpu_intervall_s"),
    ("tls_cert_file = 'c.pem'", "agent.tls_cert_file"),
    ("auth_token = ' '", "agent.auth_token"),
    ("fake_gpus = 100", "agent.fake_gpus"),
    ("vllm = [{url = 'ftp://x'}]", "agent.vllm[0].url"),
    ("vllm = [{url = 'http://a:1'}, {url = 'http://a:2'}]", "agent.vllm"),
])
def test_bad_values_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "f.toml"
    path.write_text(f"[agent]\n{text}\n")
    with pytest.raises(ConfigError) as err:
        load_agent_config(str(path), environ={})
    assert str(err.value).startswith(f"{field}:"), str(err.value)


def test_plaintext_to_a_remote_collector_can_be_allowed_explicitly() -> None:
    cfg = load_agent_config(None, {"collector": "collector:4317", "allow_plaintext": True},
                            environ={})
    assert cfg.collector == "collector:4317"


def test_root_config_has_the_agent_section(tmp_path: Path) -> None:
    from fleetlens.config import load_config

    path = tmp_path / "fleetlens.toml"
    path.write_text("[agent]\nscrape_interval_s = 2\n")
    assert load_config(path, environ={}).agent.scrape_interval_s == 2.0


def test_vllm_option() -> None:
    assert parse_vllm_option("http://127.0.0.1:8000") == VllmTarget(url="http://127.0.0.1:8000")
    assert parse_vllm_option("h/llama-0=http://127.0.0.1:8000") == VllmTarget(
        url="http://127.0.0.1:8000", instance_id="h/llama-0")
    assert parse_vllm_option("http://h:1/m?a=b").url == "http://h:1/m?a=b"


def test_config_check_prints_agent_targets_as_tables(tmp_path: Path) -> None:
    import tomllib

    from click.testing import CliRunner

    from fleetlens.cli import cli

    path = tmp_path / "fleetlens.toml"
    path.write_text("[[agent.vllm]]\nurl = 'http://127.0.0.1:8000'\ngpus = ['0']\n")
    result = CliRunner().invoke(cli, ["config", "check", str(path)], env={"FLEETLENS_CONFIG": ""})
    assert result.exit_code == 0, result.output
    printed = tomllib.loads(result.output[result.output.index("data_dir"):])
    assert printed["agent"]["vllm"] == [{"url": "http://127.0.0.1:8000", "instance_id": "",
                                         "service_name": "vllm", "gpus": ["0"], "pod": ""}]


def test_dcgm_source_and_pod_targets(tmp_path: Path) -> None:
    path = tmp_path / "fleetlens.toml"
    path.write_text('[agent]\ndcgm = "http://127.0.0.1:9400"\n[[agent.vllm]]\n'
                    'url = "http://127.0.0.1:8000"\npod = "inference/vllm-0"\n')
    cfg = load_agent_config(str(path), environ={})
    assert cfg.dcgm_metrics_url == "http://127.0.0.1:9400/metrics"
    assert cfg.vllm[0].pod == "inference/vllm-0"
    assert load_agent_config(None, environ={}, overrides={"dcgm": "http://h:9400/metrics"}
                             ).dcgm_metrics_url == "http://h:9400/metrics"
    with pytest.raises(ConfigError, match="agent.dcgm"):
        load_agent_config(None, environ={}, overrides={"dcgm": "127.0.0.1:9400"})
    with pytest.raises(ConfigError, match="agent.dcgm"):
        load_agent_config(None, environ={}, overrides={"dcgm": "http://h:9400", "fake_gpus": 2})
