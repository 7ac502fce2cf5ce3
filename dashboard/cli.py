"""``fleetlens dashboard``: serve the Streamlit dashboard over a data directory."""

from __future__ import annotations

import importlib
import os
import sys
import threading
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
    serve(streamlit_argv(cfg.address, cfg.port), env)


#: What the first page run imports and builds: a cold page load paid 2-3 s for it.
WARM_MODULES = ("duckdb", "polars", "plotly.graph_objects", "fleetlens.dashboard.data",
                "fleetlens.dashboard.ui", "fleetlens.dashboard.ranking",
                "fleetlens.dashboard.incident", "fleetlens.dashboard.charts")


def warm_up() -> None:
    """Import the pages' libraries and build one chart, so the first user does not wait
    for it. Runs beside the server's start; any failure is left to the page to report."""
    try:
        for name in WARM_MODULES:
            importlib.import_module(name)
        import plotly.graph_objects as go

        go.Figure(go.Scatter(x=[0], y=[0])).to_json()  # loads plotly's lazy validators
    except Exception:  # noqa: BLE001 - warming is an optimisation only
        pass


def serve(argv: list[str], env: dict[str, str]) -> None:
    """Run Streamlit in this process (it keeps this PID, so whoever started us can stop it
    by PID) while a thread warms the imports the first page needs."""
    os.environ.clear()
    os.environ.update(env)
    threading.Thread(target=warm_up, name="fleetlens-warm-up", daemon=True).start()
    from streamlit.web import cli as streamlit_cli

    # argv is ``python -m streamlit run APP ...``: Streamlit's own command line parses it.
    sys.argv = ["streamlit", *argv[3:]]
    streamlit_cli.main(prog_name="streamlit")
