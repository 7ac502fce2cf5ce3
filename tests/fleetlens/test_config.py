from __future__ import annotations

from pathlib import Path

import pytest

from fleetlens.config import FleetlensConfig, load_config
from fleetlens.pipeline.schema.settings import ConfigError, env_overrides


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleetlens.toml"
    path.write_text(text)
    return path


def test_defaults_are_closed() -> None:
    cfg = load_config(None, environ={})
    assert isinstance(cfg, FleetlensConfig)
    assert cfg.collector.grpc_address.startswith("127.0.0.1:")
    assert cfg.collector.http_address.startswith("127.0.0.1:")
    assert cfg.collector.max_request_bytes == 16 * 1024 * 1024


def test_valid_file(tmp_path: Path) -> None:
    path = write(tmp_path, """
data_dir = "/srv/fleetlens"
[collector]
grpc_address = "0.0.0.0:14317"
auth_tokens = ["a", "b"]
flush_interval_s = 2
[collector.tls]
cert_file = "c.pem"
key_file = "k.pem"
[pipeline]
window_s = 10
""")
    cfg = load_config(path, environ={})
    assert cfg.data_dir == "/srv/fleetlens"
    assert cfg.collector.auth_tokens == ("a", "b")
    assert cfg.collector.flush_interval_s == 2.0
    assert cfg.collector.tls.enabled
    assert cfg.pipeline.window_s == 10


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "[collector]\ngrpc_adress = '127.0.0.1:1'\n")
    with pytest.raises(ConfigError, match=r"collector.grpc_adress: unknown key; did you mean "
                                          r"'grpc_address'"):
        load_config(path, environ={})


@pytest.mark.parametrize("text,field", [
    ("[collector]\nflush_rows = 'many'\n", "collector.flush_rows"),
    ("[collector]\nflush_rows = -1\n", "collector.flush_rows"),
    ("[collector]\ngrpc_address = 'nohost'\n", "collector.grpc_address"),
    ("[collector.tls]\ncert_file = 'c.pem'\n", "collector.tls.cert_file"),
    ("[pipeline]\nwindow_s = true\n", "pipeline.window_s"),
    ("[pipeline]\ndimensions = 'region'\n", "pipeline.dimensions"),
    ("collector = 3\n", "collector"),
])
def test_bad_value_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), environ={})
    assert str(err.value).startswith(f"{field}:")


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[collector\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(path, environ={})


def test_env_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[collector]\nworkers = 1\n")
    env = {"FLEETLENS_COLLECTOR__WORKERS": "3", "FLEETLENS_DATA": "/d",
           "FLEETLENS_COLLECTOR__AUTH_TOKENS": '["t"]', "UNRELATED": "x",
           "FLEETLENS_PIPELINE__DIMENSIONS": '["region"]'}
    cfg = load_config(path, environ=env)
    assert cfg.collector.workers == 3
    assert cfg.data_dir == "/d"
    assert cfg.collector.auth_tokens == ("t",)
    assert cfg.pipeline.dimensions == ("region",)


def test_env_override_with_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match="collector.nope: unknown key"):
        load_config(None, environ={"FLEETLENS_COLLECTOR__NOPE": "1"})
    assert env_overrides({"FLEETLENS_X__Y": "plain text"}) == {"x": {"y": "plain text"}}


def test_every_command_finds_the_data_dir_the_config_file_names(tmp_path: Path,
                                                                monkeypatch) -> None:
    """``data_dir`` in fleetlens.toml is used by the pipeline, sql and analytics commands
    (not only the collector); ``$FLEETLENS_DATA`` and ``--data-dir`` still come first."""
    import json

    from click.testing import CliRunner

    from fleetlens.cli import cli
    from fleetlens.pipeline.storage import DataDir
    from tests.pipeline.fleet import make_fleet, write_batches

    monkeypatch.delenv("FLEETLENS_DATA", raising=False)
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./fleetlens.toml here, and ./fleetlens-data is visible
    configured = DataDir(tmp_path / "from-config")
    write_batches(configured, make_fleet(seed=2, seconds=60))
    (tmp_path / "etc").mkdir()
    config = write(tmp_path / "etc", f'data_dir = "{configured.root}"\n')
    runner = CliRunner()
    ran = runner.invoke(cli, ["pipeline", "--config", str(config), "--no-progress"])
    assert ran.exit_code == 0, ran.output
    assert any(configured.derived("requests").rglob("*.parquet"))
    assert not (tmp_path / "fleetlens-data").exists()

    count = "select count(*) as n from requests"
    monkeypatch.setenv("FLEETLENS_CONFIG", str(config))  # sql has no --config option
    found = runner.invoke(cli, ["sql", "--format", "json", count])
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)[0]["n"] > 0
    analysed = runner.invoke(cli, ["incidents", "--format", "json"])  # computes them first
    assert analysed.exit_code == 0, analysed.output
    assert (configured.state / "analytics" / "provenance.json").exists()

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("FLEETLENS_DATA", str(tmp_path / "elsewhere"))  # the variable wins
    elsewhere = runner.invoke(cli, ["sql", "--format", "json", count])
    assert elsewhere.exit_code == 0 and json.loads(elsewhere.stdout)[0]["n"] == 0
    flag = runner.invoke(cli, ["sql", "--data-dir", str(configured.root), "--format", "json",
                               count])
    assert json.loads(flag.stdout)[0]["n"] > 0  # and the flag wins over the variable
