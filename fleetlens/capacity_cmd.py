"""``fleetlens capacity``: the stored capacity per pool, and with ``--what-if`` the pool's
calibrated twin (issue 31 item 5).

Analytics may not import the simulator (imports flow one way), so the command line, which
may import everything, joins them: :mod:`analytics.capacity.twin` calibrates each pool from
its stored `capacity` row and telemetry, :mod:`simulator.replay` runs the last ``--hours``
of the pool's recorded arrivals through the engine model timed by that calibration, and
:mod:`analytics.capacity.twin_report` puts the measured present, the twin's replay of the
present (its own error) and the what-if side by side.
"""

from __future__ import annotations

import click
import polars as pl

from fleetlens.analytics.capacity.cli import capacity as stored_capacity
from fleetlens.analytics.cli import _CONFIG, _DATA_DIR, _root, load_analytics_config
from fleetlens.pipeline.output import format_option, refresh_option, render_rows
from fleetlens.pipeline.schema import columns as c


def _replay(cal, arrivals: pl.DataFrame, rate: float, seed: int):  # noqa: ANN001, ANN202
    """Replay ``arrivals`` (their offsets / ``rate``) through ``cal``'s engines: (latencies
    frame, unfinished count, busy seconds per engine)."""
    from fleetlens.simulator.replay import Arrival, MeasuredSteps, replay

    first = int(arrivals[c.ARRIVAL_NS].min())
    rows = [Arrival(first + int((ns - first) / rate), int(p or 1), int(o or 1))
            for ns, p, o in arrivals.select(c.ARRIVAL_NS, c.INPUT_TOKENS, c.OUTPUT_TOKENS)
            .iter_rows()]
    steps = MeasuredSteps(cal.base_s, cal.per_seq_s, cal.per_kv_s, cal.prefill_base_s,
                          cal.prefill_per_token_s, cal.hinge, cal.above_s, cal.wake_s)
    done, busy = replay(rows, cal.engines, steps, max_num_seqs=cal.max_num_seqs,
                        max_batched_tokens=cal.max_batched_tokens, kv_blocks=cal.kv_blocks,
                        seed=seed, outside_s=cal.outside_s, decode_scale=cal.decode_scale,
                        prefill_scale=cal.prefill_scale)
    frame = pl.DataFrame({c.TTFT_S: [d.ttft_s for d in done],
                          c.TPOT_S: [d.tpot_s for d in done],
                          c.OUTPUT_TOKENS: [d.output for d in done]},
                         schema={c.TTFT_S: pl.Float64, c.TPOT_S: pl.Float64,
                                 c.OUTPUT_TOKENS: pl.Int64})
    return frame, len(rows) - len(done), busy


def what_if_rows(root, row: dict, what, hours: float, config) -> tuple[list[dict], list[str]]:  # noqa: ANN001
    """The measured present, the twin's present and the what-if of one pool (rows of
    :data:`twin_report.FIGURES` plus ``row``, ``what_if`` and the pool's keys)."""
    from fleetlens.analytics.capacity.stage import POOL
    from fleetlens.analytics.capacity.twin import WhatIf, calibrate, changed
    from fleetlens.analytics.capacity.twin_data import measured_energy, pool_data
    from fleetlens.analytics.capacity.twin_report import (
        MEASURED,
        TWIN_PRESENT,
        TWIN_WHAT_IF,
        VALIDATED,
        busy_power,
        figures,
        off_present,
        twin_energy,
    )

    data = pool_data(root, row, hours)
    if data is None:
        return [], ["no requests in the period"]
    cal = calibrate(row, data.requests, data.kv_capacity, data.configs, data.gpu_samples,
                    data.engines, config)
    twin = changed(cal, row[c.MODEL], what, config)
    seconds = (data.end_ns - data.start_ns) / 1e9
    slos = (cal.tpot_slo_s, cal.ttft_slo_s)
    measured = measured_energy(data)
    out = [{"row": MEASURED, **figures(data.requests, 0, seconds, data.gpus, measured, *slos)}]
    busy_w = None
    for name, which, rate in ((TWIN_PRESENT, cal, 1.0), (TWIN_WHAT_IF, twin, what.rate)):
        frame, unfinished, busy = _replay(which, data.requests, rate, seed=0)
        if which is cal:  # the present's energy prices the twin's stepping time
            busy_w = busy_power(measured, cal.idle_w, data.gpus, seconds, cal.tp, busy)
        energy = twin_energy(busy, seconds / rate, which.tp, which.idle_w, busy_w)
        out.append({"row": name, **figures(frame, unfinished, seconds / rate,
                                           which.engines * which.tp, energy, *slos)})
    keys = {k: row[k] for k in POOL}
    labels = {MEASURED: "measured", TWIN_PRESENT: WhatIf().label(), TWIN_WHAT_IF: what.label()}
    # machine-readable output carries the table's NOT VALIDATED too
    validated = not off_present(out[0], out[1])
    return ([{**keys, **r, "what_if": labels[r["row"]], VALIDATED: validated} for r in out],
            list(twin.notes))


@click.command()
@_DATA_DIR
@_CONFIG
@format_option()
@refresh_option()
@click.option("--what-if", "what_if", multiple=True, metavar="KEY=VALUE",
              help="Replay the pool's recent arrivals through its calibrated twin with a "
                   "change: gpus=-2 (or an absolute count), gpu_model=H200, "
                   "max_num_seqs=128, rate=1.5 (repeat or comma-separate).")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="With --what-if: the last hours of arrivals replayed.")
@click.option("--service", default=None, help="With --what-if: only this service's pools.")
@click.pass_context
def capacity(ctx: click.Context, data_dir: str | None, config_file: str | None, fmt: str,
             refresh: bool | None, what_if: tuple[str, ...], hours: float,
             service: str | None) -> None:
    """Capacity per pool (service, model, GPU, TP, configuration): the knee, goodput per GPU
    at the knee and now, headroom, MBU/MFU (docs/analytics.md, "Capacity"). With --what-if:
    SLO attainment, goodput and J/token of the pool's calibrated twin against the measured
    present, and the twin's own error replaying the present unchanged."""
    if not what_if:
        ctx.invoke(stored_capacity, data_dir=data_dir, config_file=config_file, fmt=fmt,
                   refresh=refresh)
        return
    from fleetlens.analytics.capacity.twin import parse_what_if
    from fleetlens.analytics.capacity.twin_report import report_table
    from fleetlens.analytics.runner import read_table, run
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import parquet_files

    try:
        what = parse_what_if(what_if)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--what-if") from None
    config = load_analytics_config(config_file)
    root = _root(data_dir, config_file)
    if refresh or (refresh is None and next(parquet_files(root.table_dir(t.CAPACITY)), None)
                   is None):
        run(root, config, notify=False)
    pools = read_table(root, t.CAPACITY).filter(pl.col(c.KNEE_BATCH).is_not_null())
    if service is not None:
        pools = pools.filter(pl.col(c.SERVICE_NAME) == service)
    if pools.is_empty():
        raise click.ClickException("no pool with a fitted knee to calibrate a twin on "
                                   "(fleetlens capacity lists the pools)")
    rows, text = [], []
    for row in pools.sort(c.SERVICE_NAME, c.MODEL, c.GPU_MODEL, c.TP, c.CONFIG).iter_rows(
            named=True):
        try:
            found, notes = what_if_rows(root, row, what, hours, config)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--what-if") from None
        rows += found
        label = (f"{row[c.SERVICE_NAME]} / {row[c.MODEL]} on {row[c.GPU_MODEL]} "
                 f"tp{row[c.TP]} [{row[c.CONFIG]}], last {hours:g} h")
        text.append(report_table(label, found, notes) if found else f"{label}: {notes[0]}")
    if fmt == "table":
        from fleetlens.pipeline.terminal import plain

        # telemetry strings (service, model) escaped line by line
        click.echo("\n".join(plain(line) for block in text for line in block.splitlines()))
    else:
        click.echo(render_rows(pl.DataFrame(rows), fmt), nl=False)
