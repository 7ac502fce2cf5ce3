"""``fleetlens slo``: each service's SLOs, compliance, error budget left, burn rates and
firing alerts, as the last analytics run stored them; ``--rules`` prints Prometheus rules."""

from __future__ import annotations

import json

import click
import polars as pl

from fleetlens.analytics.cli import (
    _CONFIG,
    _DATA_DIR,
    _root,
    load_analytics_config,
    write_output,
)
from fleetlens.analytics.slos.config import window_label
from fleetlens.pipeline.output import format_option, refresh_option, render_rows
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
_NONE = ("no SLO is configured: add [[analytics.slos.services]] to fleetlens.toml "
         "(docs/operations.md, \"SLOs and burn-rate alerts\")\n")


def burn_key(window_s: int) -> str:
    """The output key of a window's burn rate, e.g. ``burn_rate_1h``."""
    return f"{c.BURN_RATE}_{window_label(window_s)}"


def slo_rows(status: pl.DataFrame, rates: pl.DataFrame, alerts: pl.DataFrame) -> list[dict]:
    """One dict per (service, SLO): its `slo_status` row, ``burn_rate_<window>`` per alert
    window, and its firing alerts (``alerts``: a list of `slo_alerts` rows)."""
    rows = []
    for row in status.sort(c.SERVICE_NAME, c.SLO).iter_rows(named=True):
        key = (pl.col(c.SERVICE_NAME) == row[c.SERVICE_NAME]) & (pl.col(c.SLO) == row[c.SLO])
        for rate in rates.filter(key).sort(c.WINDOW_S).iter_rows(named=True):
            row[burn_key(rate[c.WINDOW_S])] = rate[c.BURN_RATE]
        row[t.SLO_ALERTS] = alerts.filter(key).sort(c.SINCE_NS).to_dicts()
        rows.append(row)
    return rows


def _flat(rows: list[dict]) -> pl.DataFrame:
    """The rows for CSV: firing alerts as ``name (severity)`` joined by ``; ``."""
    return pl.DataFrame([{**r, t.SLO_ALERTS: "; ".join(
        f"{a[c.ALERT]} ({a[c.SEVERITY]})" for a in r[t.SLO_ALERTS])} for r in rows])


def _table(rows: list[dict]) -> str:
    from rich.table import Table

    from fleetlens.analytics.cli_table import _render, _row
    from fleetlens.analytics.report import iso

    table = Table("service", "SLO", "objective", "compliance", "budget left", "burn rates",
                  "firing")
    for row in rows:
        burns = "  ".join(f"{k.removeprefix(c.BURN_RATE + '_')} "
                          + ("-" if v is None else f"{v:.2f}x")
                          for k, v in row.items() if k.startswith(c.BURN_RATE + "_"))
        firing = "; ".join(f"{a[c.ALERT]} ({a[c.SEVERITY]}) since {iso(a[c.SINCE_NS])}"
                           for a in row[t.SLO_ALERTS]) or "-"
        compliance = "-" if row[c.COMPLIANCE] is None else f"{row[c.COMPLIANCE]:.4%}"
        _row(table, row[c.SERVICE_NAME], row[c.SLO], f"{row[c.OBJECTIVE]:.4%}", compliance,
             f"{row[c.BUDGET_REMAINING]:.1%}", burns, firing)
    days = rows[0][c.PERIOD_S] / 86400 if rows else 0
    return _render(table) + f"{len(rows)} SLOs; compliance and budget over {days:g} days\n"


@click.command()
@_DATA_DIR
@_CONFIG
@format_option()
@refresh_option()
@click.option("--rules", is_flag=True,
              help="Print Prometheus recording and alerting rules for the configured SLOs "
                   "(over `fleetlens exporter`'s series) instead.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="With --rules: write them to this file.")
def slo(data_dir: str | None, config_file: str | None, fmt: str, refresh: bool | None,
        rules: bool, output: str | None) -> None:
    """Each service's SLOs: objective, compliance and error budget left over the compliance
    period, burn rates per alert window, and the burn-rate alerts firing now."""
    config = load_analytics_config(config_file)
    if rules:
        from fleetlens.analytics.slos.rules import rules_yaml

        if not config.slos.services:
            raise click.ClickException(_NONE.strip())
        text = rules_yaml(config.slos)
        if output:
            write_output(output, text)
        else:
            click.echo(text, nl=False)
        return
    from fleetlens.analytics.runner import read_table, run
    from fleetlens.pipeline.storage import parquet_files

    root = _root(data_dir, config_file)
    never = next(parquet_files(root.table_dir(t.SLO_STATUS)), None) is None
    if refresh or (refresh is None and never):
        run(root, config, notify=False)
    rows = slo_rows(read_table(root, t.SLO_STATUS), read_table(root, t.SLO_BURN_RATES),
                    read_table(root, t.SLO_ALERTS))
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
    elif fmt == "csv":
        click.echo(render_rows(_flat(rows), fmt) if rows else "", nl=False)
    elif not rows and not config.slos.services:
        click.echo(_NONE, nl=False)
    else:
        click.echo(_table(rows), nl=False)
