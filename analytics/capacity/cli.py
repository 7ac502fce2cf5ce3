"""``fleetlens capacity``: per pool the knee, goodput, headroom and MBU/MFU, as the last
analytics run stored them in the `capacity` table (``--refresh`` runs the analytics first)."""

from __future__ import annotations

import click
import polars as pl

from fleetlens.analytics.cli import _CONFIG, _DATA_DIR, _root, load_analytics_config
from fleetlens.pipeline.output import format_option, refresh_option, render_rows
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

_NONE = ("no capacity rows: the last analytics run found no engine samples with requests "
         "(run `fleetlens analyze`, or pass --refresh)\n")


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def capacity_table(frame: pl.DataFrame) -> str:
    """Per pool, a few lines of at most about 80 columns (a terminal's width): the knee (its
    interval and what set it), goodput at the knee and now, headroom, the forecast, MBU/MFU
    and the batches visited. Telemetry strings go through :func:`pipeline.terminal.plain`."""
    from fleetlens.pipeline.terminal import plain

    lines = []
    for row in frame.iter_rows(named=True):
        lines.append(plain(f"{row[c.SERVICE_NAME]} / {row[c.MODEL]} on {row[c.GPU_MODEL]} "
                           f"tp{row[c.TP]} [{row[c.CONFIG]}]"))
        knee = row[c.KNEE_BATCH]
        if knee is None:
            lines.append(f"  knee: {row[c.KNEE_LIMIT]} ({row[c.WINDOWS_USED]} usable windows)")
        else:
            lines.append(
                f"  knee: batch {knee:.0f} ({row[c.KNEE_BATCH_LO]:.0f}-"
                f"{row[c.KNEE_BATCH_HI]:.0f}), limited by {row[c.KNEE_LIMIT]}"
                + (", extrapolated" if row[c.EXTRAPOLATED] else "")
                + f"; {_num(row[c.KNEE_RPS], '.2f')} req/s")
        headroom = "-" if row[c.HEADROOM_X] is None else f"x{row[c.HEADROOM_X]:.2f}"
        lines.append(f"  goodput/GPU: {_num(row[c.GOODPUT_RPS_PER_GPU], '.2f')} at the knee, "
                     f"{_num(row[c.GOODPUT_NOW_RPS_PER_GPU], '.2f')} now; "
                     f"{_num(row[c.RPS_NOW], '.2f')} req/s now, headroom {headroom}")
        lines.append(f"  forecast: {_crossing(row)}")
        lines.append(f"  now: MBU {_num(row[c.MBU], '.0%')}, MFU {_num(row[c.MFU], '.1%')}"
                     f" ({row[c.BOUND] or '-'}-bound); batches seen "
                     f"{_num(row[c.BATCH_MIN], '.0f')}-{_num(row[c.BATCH_MAX], '.0f')}")
    return "\n".join(lines) + f"\n{frame.height} pools\n"


def _crossing(row: dict) -> str:
    """``at <time>: +N GPUs``, ``no (peak x.xx req/s)``, or ``-`` without a forecast."""
    from fleetlens.analytics.report import iso

    if row.get(c.FORECAST_PEAK_RPS) is None:
        return "-"
    if row.get(c.CROSSING_NS) is None:
        return f"the peak ({row[c.FORECAST_PEAK_RPS]:.2f} req/s) stays under the knee"
    return (f"the peak ({row[c.FORECAST_PEAK_RPS]:.2f} req/s) passes the knee at "
            f"{iso(row[c.CROSSING_NS])}: about {row[c.GPUS_NEEDED]} more GPUs")


@click.command()
@_DATA_DIR
@_CONFIG
@format_option()
@refresh_option()
def capacity(data_dir: str | None, config_file: str | None, fmt: str,
             refresh: bool | None) -> None:
    """Capacity per pool (service, model, GPU, TP, configuration): the knee (largest batch
    and arrival rate meeting the TPOT and TTFT SLOs), goodput per GPU at the knee and now,
    headroom before the knee, MBU/MFU and the bound (docs/analytics.md, "Capacity")."""
    config = load_analytics_config(config_file)
    from fleetlens.analytics.runner import read_table, run
    from fleetlens.pipeline.storage import parquet_files

    root = _root(data_dir, config_file)
    never = next(parquet_files(root.table_dir(t.CAPACITY)), None) is None
    if refresh or (refresh is None and never):
        run(root, config, notify=False)
    frame = read_table(root, t.CAPACITY).sort(c.SERVICE_NAME, c.MODEL, c.GPU_MODEL, c.TP,
                                               c.CONFIG)
    if fmt != "table":
        click.echo(render_rows(frame, fmt), nl=False)
    elif frame.is_empty():
        click.echo(_NONE, nl=False)
    else:
        click.echo(capacity_table(frame), nl=False)
