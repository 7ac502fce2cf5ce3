"""``fleetlens dashboard``: serve the Streamlit dashboard over a data directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from fleetlens.pipeline.schema.settings import DATA_DIR_HELP

APP = Path(__file__).resolve().parent / "app.py"


def streamlit_argv(address: str, port: int) -> list[str]:
    """The command line that serves the app (headless, no file watcher, no telemetry)."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", address, "--server.port", str(port),
        "--server.headless", "true", "--server.fileWatcherType", "none",
        "--server.runOnSave", "false", "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false", "--client.toolbarMode", "minimal",
        # An uncaught exception shows a generic message in the browser; its type, message
        # and traceback (paths, SQL, data) go to the server log only.
        "--client.showErrorDetails", "none",
    ]


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help=DATA_DIR_HELP)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="fleetlens.toml [default: $FLEETLENS_CONFIG or ./fleetlens.toml].")
@click.option("--address", default=None, help="Address to bind [default: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port [default: 8501].")
@click.option("--hash-password", is_flag=True,
              help="Prompt for a password, print its hash for `password_hash`, and exit.")
def dashboard(data_dir: str | None, config_path: str | None, address: str | None,
              port: int | None, hash_password: bool) -> None:
    """Serve the dashboard (Streamlit) for the data directory.

    Binds 127.0.0.1:8501 unless configured otherwise ([dashboard] address/port). Any other
    address needs auth = "password" or "oidc" in the [dashboard] section.
    """
    from fleetlens.dashboard.auth import hash_password as make_hash
    from fleetlens.dashboard.config import load_dashboard_config
    from fleetlens.pipeline.schema.settings import ENV_CONFIG_FILE, ENV_DATA_DIR, ConfigError
    from fleetlens.pipeline.storage import DataDir

    if hash_password:
        secret = click.prompt("Password", hide_input=True, confirmation_prompt=True)
        click.echo(make_hash(secret))
        return
    env = dict(os.environ)
    if address:
        env["FLEETLENS_DASHBOARD__ADDRESS"] = f'"{address}"'
    if port:
        env["FLEETLENS_DASHBOARD__PORT"] = str(port)
    try:
        cfg = load_dashboard_config(config_path, environ=env)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    root = DataDir.from_env(data_dir, config_path)
    env[ENV_DATA_DIR] = str(root.root)
    if config_path:
        env[ENV_CONFIG_FILE] = str(Path(config_path).resolve())
    host = f"[{cfg.address}]" if ":" in cfg.address else cfg.address
    click.echo(f"fleetlens dashboard: http://{host}:{cfg.port} (data: {root.root}, "
               f"auth: {cfg.auth})", err=True)
    argv = streamlit_argv(cfg.address, cfg.port)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: the server keeps this PID, so whoever started us can stop it by PID.
    os.execvpe(argv[0], argv, env)
