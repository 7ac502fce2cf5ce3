"""``fleetlens exporter``: serve the derived signals of :mod:`analytics.exporter` over HTTP."""

from __future__ import annotations

import signal
import threading

import click

from fleetlens.pipeline.schema.settings import DATA_DIR_HELP, is_loopback


@click.command()
@click.option("--data-dir", default=None, help=DATA_DIR_HELP)
@click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False),
              help="fleetlens.toml (for data_dir) [env FLEETLENS_CONFIG].")
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback unless you open it on purpose).")
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True,
              help="Port of http://ADDRESS:PORT/metrics.")
@click.option("--refresh", "refresh_s", type=click.FloatRange(min=0), default=15.0,
              show_default=True, help="Seconds a read of the tables is reused across scrapes.")
@click.option("--lookback", "lookback_s", type=click.FloatRange(min=60), default=3600.0,
              show_default=True,
              help="Seconds before the newest window a read covers; a series silent longer "
                   "is no longer served.")
def exporter(data_dir: str | None, config_file: str | None, address: str, port: int,
             refresh_s: float, lookback_s: float) -> None:
    """Serve fleetlens' derived signals for Prometheus and Grafana at /metrics.

    Per service, model and host: request, error and token counters and TTFT/TPOT/e2e
    histograms (from the windows closed since it started); J/token, KV-cache usage and the
    baselines of the latest closed window, for the series heard from in the last --lookback;
    the active incidents by top cause (with a link to each one's page when [analytics]
    dashboard_url is set); the SLOs. Dashboards and rules over
    these series: deploy/grafana/fleetlens.json, deploy/prometheus/.
    """
    from prometheus_client import CollectorRegistry, start_http_server

    from fleetlens.analytics.cli import load_analytics_config
    from fleetlens.analytics.exporter import DerivedSignals
    from fleetlens.pipeline.cli import resolve_data_dir

    root = resolve_data_dir(data_dir, config_file, must_exist=False)
    dashboard_url = load_analytics_config(config_file).dashboard_url
    if not is_loopback(address, resolve=True):
        click.echo(f"warning: the exporter listens on {address}, beyond this machine; it has "
                   "no authentication (put it behind your network policy or a proxy)", err=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DerivedSignals(root, refresh_s, dashboard_url, lookback_s))
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {address}:{port}: {exc}") from None
    click.echo(f"serving http://{address}:{server.server_port}/metrics from {root.root}",
               err=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
    click.echo("stopped", err=True)
