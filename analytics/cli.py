"""``fleetlens analyze``, ``incidents``, ``explain`` and ``baselines``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.output import format_option, refresh_option, render_rows
from fleetlens.pipeline.schema.settings import DATA_DIR_HELP, ConfigError, load_section

NS = 1_000_000_000
_DATA_DIR = click.option("--data-dir", "data_dir", type=click.Path(file_okay=False),
                         default=None,
                         help=DATA_DIR_HELP)
_CONFIG = click.option("--config", "config_file", type=click.Path(dir_okay=False),
                       default=None,
                       help="fleetlens.toml [default: $FLEETLENS_CONFIG or ./fleetlens.toml].")


def load_analytics_config(path: str | None) -> AnalyticsConfig:
    """The ``[analytics]`` section: defaults, config file, then FLEETLENS_ANALYTICS__*."""
    try:
        return load_section(AnalyticsConfig, "analytics", path)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def _root(data_dir: str | None, config_file: str | None = None, *,  # noqa: ANN202
          must_exist: bool = True):
    from fleetlens.pipeline.cli import resolve_data_dir

    return resolve_data_dir(data_dir, config_file, must_exist=must_exist)


def write_output(path: str, text: str) -> None:
    """``--output``: write ``text`` to ``path``; a folder that does not exist or may not be
    written is the user's to fix, so it is one line, not a traceback."""
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None
    click.echo(f"wrote {path}", err=True)


def parse_since(text: str, now_ns: int | None = None) -> int:
    """``2h`` / ``30m`` / ``1d`` ago, ``now-2h``, an ISO-8601 time (UTC if no zone), or a
    Unix time in s, ms, µs or ns: the one time grammar (:mod:`pipeline.schema.timegrammar`)."""
    from fleetlens.pipeline.schema.timegrammar import parse_time

    try:
        return parse_time(text, now_ns)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _remote(runner: str, ray_address: str | None):  # noqa: ANN202 - RayAnalytics or None
    """``--runner``/``--ray-address`` as the run's ``remote`` (Ray imported only for ray)."""
    if runner == "local":
        if ray_address is not None:
            raise click.UsageError("--ray-address needs --runner ray")
        return None
    try:
        from fleetlens.analytics.ray_tasks import RayAnalytics
    except ImportError as exc:
        raise click.ClickException(
            f"--runner ray needs Ray, which could not be imported ({exc}); install it with "
            "`pip install 'fleetlens[ray]'` (ray==2.60.0)") from None
    return RayAnalytics(ray_address)


@click.command()
@_DATA_DIR
@_CONFIG
@click.option("--follow", is_flag=True, help="Keep running; post new incidents as they come.")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True,
              help="Seconds between runs with --follow.")
@click.option("--refit", is_flag=True, help="Refit Prophet baselines now (if enabled).")
@click.option("--runner", type=click.Choice(("local", "ray")), default="local",
              show_default=True, help="Attribute incidents and fit Prophet here (local) or "
              "as Ray tasks (ray: same tables; needs the 'ray' extra).")
@click.option("--ray-address", default=None, metavar="HOST:PORT",
              help="With --runner ray: the head of the Ray cluster to join [default: "
                   "$RAY_ADDRESS, else start Ray on this machine].")
def analyze(data_dir: str | None, config_file: str | None, follow: bool, interval: float,
            refit: bool, runner: str, ray_address: str | None) -> None:
    """Compute baselines, incidents and ranked causes from the pipeline's tables.

    New incidents are printed as JSON lines and posted to [analytics] webhooks.
    """
    from fleetlens.analytics.runner import run

    remote = _remote(runner, ray_address)
    config = load_analytics_config(config_file)
    root = _root(data_dir, config_file, must_exist=not follow)
    while True:
        result = run(root, config, echo=click.echo, refit_prophet=refit, remote=remote)
        for error in result.post_errors:
            click.echo(f"webhook failed: {error}", err=True)
        click.echo(f"analytics: {result.analysis.incidents.height} incidents "
                   f"({len(result.new_incidents)} new) in {result.seconds:.2f} s", err=True)
        if not follow:
            return
        refit = False
        time.sleep(interval)


@click.command()
@_DATA_DIR
@_CONFIG
@click.option("--since", default=None,
              help="Only incidents starting after: 2h, now-2h, an ISO time, or a Unix time.")
@format_option()
@refresh_option()
def incidents(data_dir: str | None, config_file: str | None, since: str | None, fmt: str,
              refresh: bool | None) -> None:
    """List incidents with severity, scope and top cause, newest first."""
    import polars as pl

    from fleetlens.analytics.runner import read_table, run
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import parquet_files

    root = _root(data_dir, config_file)
    never = next(parquet_files(root.table_dir(t.INCIDENTS)), None) is None
    if refresh or (refresh is None and never):
        run(root, load_analytics_config(config_file), notify=False)
    table = read_table(root, t.INCIDENTS)
    if since:
        table = table.filter(pl.col(c.START_NS) >= parse_since(since))
    top = read_table(root, t.CAUSES).filter(pl.col(c.RANK) == 1).select(
        c.INCIDENT_ID, c.CAUSE, c.SUBJECT, c.SUMMARY)
    table = table.join(top, on=c.INCIDENT_ID, how="left").sort(c.START_NS, descending=True)
    if fmt != "table":
        click.echo(render_rows(table, fmt), nl=False)
        return
    from fleetlens.analytics.cli_table import incidents_table

    click.echo(incidents_table(table), nl=False)


@click.command()
@click.argument("ident", metavar="INCIDENT_ID")
@_DATA_DIR
@format_option("text", "markdown", "html", "json", default="text")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write the report to this file instead of stdout.")
def explain(ident: str, data_dir: str | None, fmt: str, output: str | None) -> None:
    """Explain incident INCIDENT_ID (or a unique prefix): causes, evidence, provenance."""
    from fleetlens.analytics.report import UnknownIncident, build_report
    from fleetlens.analytics.report_render import RENDERERS

    try:
        report = build_report(_root(data_dir), ident)
    except UnknownIncident as exc:
        raise click.ClickException(str(exc)) from None
    text = RENDERERS[fmt](report)
    if output:
        write_output(output, text)
    else:
        from fleetlens.pipeline.terminal import plain

        # Hosts, services and subjects come from telemetry: no raw ESC/OSC to the terminal.
        click.echo(plain(text), nl=False)


@click.command()
@_DATA_DIR
@_CONFIG
@click.option("--refit", is_flag=True, help="Recompute now and refit Prophet (if enabled).")
@click.option("--series", "pattern", default=None, help="Only series containing this text.")
@click.option("--all", "show_all", is_flag=True,
              help="Table: also the series within their band (json and csv print every one).")
@format_option()
def baselines(data_dir: str | None, config_file: str | None, refit: bool, pattern: str | None,
              show_all: bool, fmt: str) -> None:
    """Show each series' latest value against its baseline band (rolling and Prophet):
    those out of their band, farthest first; --all adds the rest."""
    import polars as pl

    from fleetlens.analytics.runner import read_table, run
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.schema import tables as t

    root = _root(data_dir, config_file)
    if refit:
        result = run(root, load_analytics_config(config_file), notify=False,
                     refit_prophet=True)
        click.echo(f"recomputed {result.analysis.baselines[c.SERIES].n_unique()} series; "
                   f"Prophet refitted {result.prophet_series}", err=True)
    table = read_table(root, t.BASELINES)
    if pattern:
        table = table.filter(pl.col(c.SERIES).str.contains(pattern, literal=True))
    latest = table.sort(c.TS_NS).group_by(c.SERIES, c.METHOD).last().sort(c.SERIES, c.METHOD)
    if fmt != "table":
        click.echo(render_rows(latest, fmt), nl=False)
        return
    from fleetlens.analytics.cli_table import baselines_table

    click.echo(baselines_table(latest, show_all), nl=False)


@click.command()
@_DATA_DIR
@_CONFIG
@click.option("--by-bucket", is_flag=True, help="Rank within each prompt-length bucket.")
@click.option("--sla", default=None,
              help="Override [analytics] sla, e.g. 'ttft_p99_s=0.5,tpot_p99_s=0.05'.")
@click.option("--samples", type=int, default=None, help="Bootstrap resamples for rank CIs.")
@click.option("--include-incidents", is_flag=True,
              help="Rank every request, also those of incidents and of the newest window.")
@format_option()
def leaderboard(data_dir: str | None, config_file: str | None, by_bucket: bool,
                sla: str | None, samples: int | None, include_incidents: bool,
                fmt: str) -> None:
    """Rank (model, GPU model, config) by latency, throughput per GPU and J/token.

    Ranks steady service, as the dashboard's leaderboard does: requests that arrived during
    an incident of their scope, or in the newest (still filling) window, are left out.
    """
    import dataclasses

    from fleetlens.analytics.leaderboard import best_under_sla, prepare
    from fleetlens.analytics.leaderboard import leaderboard as board_of
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import scan

    config = load_analytics_config(config_file)
    if samples is not None:
        config = dataclasses.replace(config, bootstrap_samples=max(samples, 10))
    limits = dict(config.sla)
    if sla:
        try:
            limits = {k.strip(): float(v) for k, v in
                      (part.split("=", 1) for part in sla.split(",") if part.strip())}
        except ValueError:
            raise click.BadParameter(f"{sla!r}: expected column=limit[,column=limit]") from None
    root = _root(data_dir, config_file)
    requests = scan(root, t.REQUESTS).collect()
    if not include_incidents:
        requests = _steady_requests(root, requests)
    prepared = prepare(requests, scan(root, t.INSTANCE_GPUS).collect(),
                       scan(root, t.GPU_SAMPLES).collect(),
                       scan(root, t.REQUEST_ENERGY).collect())
    from fleetlens.analytics.runner import read_table

    # goodput and J/token at the knee: what the last analytics run stored per pool
    board = board_of(prepared, config, by_bucket=by_bucket,
                     capacity=read_table(root, t.CAPACITY))
    try:
        best = best_under_sla(board, limits) if board.height else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps({"leaderboard": board.to_dicts(), "sla": limits,
                               "best_under_sla": best}, indent=2, default=str))
        return
    if fmt == "csv":  # the ranking itself; the SLA pick is a column of the table view only
        click.echo(render_rows(board, fmt), nl=False)
        return
    from fleetlens.analytics.cli_table import leaderboard_table

    click.echo(leaderboard_table(board, best, limits), nl=False)


def _steady_requests(root, requests):  # noqa: ANN001, ANN202 - DataDir, pl.DataFrame
    """``requests`` less the newest window and the incidents of their scope (the dashboard's
    leaderboard ranks the same requests: tests/analytics/test_cli_formats.py)."""
    import polars as pl

    from fleetlens.analytics.leaderboard import outside_incidents
    from fleetlens.analytics.runner import read_table
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import has_parquet, scan

    if has_parquet(root.table_dir(t.WINDOWS)):
        newest = scan(root, t.WINDOWS).select(pl.col(c.WINDOW_START_NS).max()).collect().item()
        if newest is not None:
            requests = requests.filter(pl.col(c.ARRIVAL_NS) < newest)
    return outside_incidents(requests, read_table(root, t.INCIDENTS))
