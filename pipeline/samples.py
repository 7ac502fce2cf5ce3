"""Stage ``samples``: raw ``metric_points`` -> ``gpu_samples``, ``engine_samples`` and
``instance_gpus``.

Metric names and units follow TEAM.md (OpenTelemetry hardware conventions for GPUs, the
agent's ``vllm.*`` names for engines; vLLM's own Prometheus family names are accepted too).
Values are normalised to the units in the column names (W, J, bytes, MHz, 0..1). Delivery is
at least once: repeated points of a series at one timestamp collapse into one sample.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from fleetlens.pipeline.attrs import extract_keys
from fleetlens.pipeline.gpupoints import (
    COLUMNS,
    ENERGY_DELTA,
    GID,
    JOULES,
    SERIES,
    T1,
    UTIL_MEM_LEGACY,
    GpuPoints,
    energy_intervals,
    gpu_points,
)
from fleetlens.pipeline.pivot import KEY, SLOT, SRC, Split, as_split, pivot_sorted
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.stage import stage

_NS = 1_000_000_000

#: Engine metric -> engine_samples column.
ENGINE_METRICS: dict[str, str] = {
    a.ENGINE_KV_CACHE_USAGE: c.KV_CACHE_USAGE, a.ENGINE_NUM_RUNNING: c.NUM_RUNNING,
    a.ENGINE_NUM_WAITING: c.NUM_WAITING, a.ENGINE_PREEMPTIONS: c.PREEMPTIONS_TOTAL,
    a.ENGINE_PREFIX_CACHE_QUERIES: c.PREFIX_CACHE_QUERIES_TOTAL,
    a.ENGINE_PREFIX_CACHE_HITS: c.PREFIX_CACHE_HITS_TOTAL,
    a.ENGINE_PROMPT_TOKENS: c.PROMPT_TOKENS_TOTAL,
    a.ENGINE_GENERATION_TOKENS: c.GENERATION_TOKENS_TOTAL,
}
#: Engine metric -> column written beside the table's (null where the engine lacks it).
ENGINE_EXTRA_METRICS: dict[str, str] = {
    a.ENGINE_KV_CACHE_CAPACITY: c.KV_CAPACITY_TOKENS, a.ENGINE_UP: c.UP,
    a.ENGINE_START_TIME: c.PROCESS_START_TIME_S, a.ENGINE_UNRESPONSIVE: c.UNRESPONSIVE}
#: Every accepted engine metric name (ours and vLLM's, old and new) -> our name.
ENGINE_ALIASES: dict[str, str] = {
    **{name: name for name in [*ENGINE_METRICS, *ENGINE_EXTRA_METRICS]},
    **{alias: ours for ours, aliases in a.VLLM_PROMETHEUS_NAMES.items() for alias in aliases},
    a.ENGINE_REQUESTS_FINISHED: a.ENGINE_REQUESTS_FINISHED,
    a.VLLM_REQUEST_SUCCESS: a.ENGINE_REQUESTS_FINISHED,  # same finished_reason label
}
#: vLLM's finished reasons (FinishReason): one hidden column each, summed into
#: ``requests_finished_total``; a reason vLLM adds later lands in the "other" column.
_FINISHED = {reason: f"__finished_{reason}" for reason in a.FINISHED_REASONS}
_FINISHED_OTHER = "__finished_other"
_INSTANCE, _MODEL_LABEL, _REASON = "__instance", "__model_label", "__finished_reason"

GROUP = "__group"
_PACK_BITS = 43
_PACK_TS = 1 << _PACK_BITS  # ns: about 2.4 hours of timestamps packed beside the series rank
#: Per source combination: the output column its points go to (null: ignored), and the factor
#: and divisor taking its values to the column's unit.
_COLUMN, _MUL, _DIV = "__column", "__mul", "__div"


def _wide(points: pl.DataFrame | Split, columns_of: Callable[[pl.DataFrame], pl.DataFrame],
          columns: list[str], series: list[str],
          describe: Callable[[pl.DataFrame], pl.DataFrame],
          labels: tuple[pl.Expr, ...] = ()) -> pl.DataFrame:
    """One row per (series, ts_ns) with one column per metric, sorted by series then time.

    A point's source is its (host, service, attributes, metric, unit, temporality) combination
    (:func:`pipeline.pivot.split_sources`): ``columns_of`` gets the distinct combinations and
    adds the output column (one of ``columns``, null to ignore the combination), factor and
    divisor; ``describe`` adds the ``series`` columns, and ``labels`` aggregate per series. Only
    the integer code of a combination touches the per-point rows, and (series rank, time) is
    packed into one int64 so the pivot sorts a single integer column. Repeated points of one
    column at one key (duplicate deliveries) collapse to their maximum: the value itself for a
    duplicate, the latest value for a counter. The result carries :data:`GROUP`, the series'
    rank in sorted order, for ``shift``-based per-series computations.
    """
    slim, combos = as_split(points)
    combos = columns_of(combos).filter(pl.col(_COLUMN).is_not_null())
    seen = set(combos.get_column(_COLUMN).to_list())
    present = [col for col in columns if col in seen]
    combos = describe(combos)
    ranks = (combos.group_by(series).agg(*labels).sort(series).with_row_index(GROUP)
             .with_columns(pl.col(GROUP).cast(pl.Int64)))
    combos = combos.join(ranks.select(*series, GROUP), on=series, how="left", nulls_equal=True)
    combos = combos.with_columns(pl.col(_COLUMN).replace_strict(
        present, list(range(len(present))), return_dtype=pl.Int64).alias(SLOT))
    # The points of these combinations first (one integer test per point), then the join
    frame = slim.filter(pl.col(SRC).is_in(combos.get_column(SRC).implode())).join(
        combos.select(SRC, GROUP, SLOT, _MUL, _DIV), on=SRC, how="inner")
    frame = frame.with_columns((pl.col(c.VALUE) * pl.col(_MUL) / pl.col(_DIV)).alias(c.VALUE))
    base = int(frame.get_column(c.TS_NS).min() or 0)
    span = int(frame.get_column(c.TS_NS).max() or 0) - base
    if span < _PACK_TS and ranks.height < (1 << (62 - _PACK_BITS)):
        packed = pl.col(GROUP) * _PACK_TS + (pl.col(c.TS_NS) - base)
        wide = pivot_sorted(frame, present, packed).with_columns(
            (pl.col(KEY) // _PACK_TS).alias(GROUP),
            (pl.col(KEY) % _PACK_TS + base).alias(c.TS_NS)).drop(KEY)
    else:  # more than ~2.4 hours or 500k series in one frame: group on two integer columns
        wide = frame.with_columns([
            pl.when(pl.col(SLOT) == slot).then(pl.col(c.VALUE)).alias(column)
            for slot, column in enumerate(present)
        ]).group_by(GROUP, c.TS_NS).agg(pl.col(present).max()).sort(GROUP, c.TS_NS)
    wide = wide.join(ranks, on=GROUP, how="left", maintain_order="left")
    missing = [pl.lit(None, pl.Float64).alias(col) for col in columns if col not in seen]
    return wide.with_columns(missing)


#: How the points of one column in one interval make the row's value: the mean of a gauge,
#: the last reading of a counter or a setting, every bit any point of the throttle-reason mask
#: had, the sum of delta energy (the row's energy itself is ``energy_delta_j``).
_LAST = (c.ENERGY_J, c.MEM_TOTAL_BYTES, c.POWER_LIMIT_W)
_KINDS: dict[str, pl.Expr] = {
    "mean": pl.col(c.VALUE).mean(), "last": pl.col(c.VALUE).last(),
    # (a reading no int64 holds is no mask: null, not a failed hour)
    "bits": pl.col(c.VALUE).cast(pl.Int64, strict=False).bitwise_or().cast(pl.Float64),
    "sum": pl.col(c.VALUE).sum(),
}


def _kind(column: str) -> str:
    if column in _LAST:
        return "last"
    if column == c.CLOCKS_EVENT_REASONS:
        return "bits"
    return "sum" if column == ENERGY_DELTA else "mean"


def interval_ns(interval_s: float) -> int:
    """The sample interval in ns (a positive whole number of them)."""
    step = round(interval_s * _NS)
    if step <= 0:
        raise ValueError(f"gpu sample interval must be positive, got {interval_s!r} s")
    return step


@stage(t.GPU_SAMPLES)
def gpu_samples(points: pl.DataFrame | Split | GpuPoints, max_gap_s: float,
                interval_s: float = 1.0) -> pl.DataFrame:
    """GPU metric points -> one row per (host, GPU, interval of ``interval_s``).

    Input: ``metric_points`` (deduplicated or not; other metrics are ignored; source columns
    String or Categorical), their :class:`~pipeline.pivot.Split` or
    :class:`~pipeline.gpupoints.GpuPoints`. A row at ``ts_ns`` (a multiple of the interval)
    sums up the GPU's points in ``[ts_ns, ts_ns + interval)``: the mean of each gauge (power,
    utilisation, memory used, clock, temperature), the last energy counter reading, memory
    total and power limit, and every ``clocks_event_reasons`` bit set in any of them. Output:
    ``gpu_samples`` sorted by (host_name, gpu_uuid, ts_ns), plus ``mem_total_bytes`` and
    ``energy_delta_j``: the energy of the GPU's native sample intervals that end in the row's
    interval (:func:`~pipeline.gpupoints.energy_intervals`: delta sums, else counter
    increases with restarts handled, else the trapezoid of power; nothing across a gap longer
    than ``max_gap_s``), null when none does. Summed over rows it is the GPU's measured energy.
    """
    gp = gpu_points(points)
    step = interval_ns(interval_s)
    n = max(len(gp.columns), 1)
    ts = gp.rows.get_column(c.TS_NS)
    base = int(ts.min() or 0)
    base -= base % step
    buckets = (int(ts.max() or 0) - base) // step + 1
    # (series, interval) packs into one int64 key: one hashed column per group-by.
    if (gp.gpus.height * n * buckets).bit_length() > 62:
        raise ValueError("too many GPU sample intervals in one frame: use a longer interval")
    bucket = (pl.col(c.TS_NS) - base) // step
    # The rows are sorted by (series, time), so the packed keys come sorted: grouping them
    # needs no hashing.
    packed = (pl.col(SERIES) * buckets + bucket).set_sorted().alias(KEY)
    parts = []
    for kind, agg in _KINDS.items():
        slots = [i for i, col in enumerate(gp.columns) if _kind(col) == kind]
        if not slots:
            continue
        rows = gp.rows if len(slots) == n else gp.rows.filter((pl.col(SERIES) % n).is_in(slots))
        parts.append(rows.select(packed, c.VALUE).group_by(KEY, maintain_order=True).agg(agg))
    long = pl.concat(parts) if parts else pl.DataFrame(schema={KEY: pl.Int64, c.VALUE: pl.Float64})
    per_gpu = (pl.col(KEY) // buckets // n) * buckets + pl.col(KEY) % buckets
    wide = pivot_sorted(long.with_columns((pl.col(KEY) // buckets % n).alias(SLOT)), gp.columns,
                        per_gpu)
    # Each source's intervals come sorted by (GPU, end): summed per row without hashing too.
    energy = [iv.select((pl.col(GID) * buckets + (pl.col(T1) - base) // step).set_sorted()
                        .alias(KEY), JOULES).group_by(KEY, maintain_order=True)
              .agg(pl.col(JOULES).sum().alias(c.ENERGY_DELTA_J))
              for iv in energy_intervals(gp, max_gap_s)]
    if len(energy) != 1:  # power filling in beside a counter can end in the same row
        energy = [pl.concat(energy or [pl.DataFrame(schema={KEY: pl.Int64,
                                                            c.ENERGY_DELTA_J: pl.Float64})])
                  .group_by(KEY).agg(pl.col(c.ENERGY_DELTA_J).sum())]
    wide = wide.join(energy[0], on=KEY, how="left", maintain_order="left").with_columns(
        (pl.col(KEY) // buckets).alias(GID), (pl.col(KEY) % buckets * step + base).alias(c.TS_NS))
    wide = wide.join(gp.gpus, on=GID, how="left", maintain_order="left")
    missing = [pl.lit(None, pl.Float64).alias(col) for col in COLUMNS if col not in gp.columns]
    wide = wide.with_columns(missing).with_columns(
        pl.col(c.CLOCKS_EVENT_REASONS).cast(pl.Int64),
        pl.coalesce(c.UTIL_MEM, UTIL_MEM_LEGACY).alias(c.UTIL_MEM))
    columns = [*t.table(t.GPU_SAMPLES).columns, c.MEM_TOTAL_BYTES, c.ENERGY_DELTA_J]
    return wide.select(columns)


def _engine_name() -> pl.Expr:
    """Our name of an engine metric (null for any other metric)."""
    return pl.col(c.METRIC_NAME).replace_strict(ENGINE_ALIASES, default=None,
                                                return_dtype=pl.String)


def _engine_columns(combos: pl.DataFrame) -> pl.DataFrame:
    """Output column and divisor (percent to fraction) of each engine metric combination;
    finished requests go to one hidden column per ``finished_reason``."""
    combos = extract_keys(combos, c.ATTRIBUTES, {a.ENGINE_FINISHED_REASON: (_REASON, pl.String())})
    by_reason = pl.col(_REASON).replace_strict(_FINISHED, default=_FINISHED_OTHER,
                                               return_dtype=pl.String)
    column = pl.when(_engine_name() == a.ENGINE_REQUESTS_FINISHED).then(by_reason).otherwise(
        _engine_name().replace_strict({**ENGINE_METRICS, **ENGINE_EXTRA_METRICS}, default=None,
                                      return_dtype=pl.String))
    divisor = pl.when(pl.col(c.UNIT) == "%").then(100.0).otherwise(1.0)
    return combos.with_columns(column.alias(_COLUMN), pl.lit(1.0).alias(_MUL),
                               divisor.alias(_DIV)).drop(_REASON)


def _describe_instances(combos: pl.DataFrame) -> pl.DataFrame:
    """Instance id (the agent's label, else ``host/service``) and model of each combination."""
    combos = extract_keys(combos, c.ATTRIBUTES, {
        a.ENGINE_INSTANCE: (_INSTANCE, pl.String()),
        a.ENGINE_MODEL_NAME: (_MODEL_LABEL, pl.String()),
    })
    instance = pl.coalesce(
        _INSTANCE, pl.concat_str(pl.col(c.HOST_NAME), pl.lit("/"), c.SERVICE_NAME))
    return combos.with_columns(instance.alias(c.INSTANCE_ID),
                               pl.col(_MODEL_LABEL).fill_null("").alias(c.MODEL))


@stage(t.ENGINE_SAMPLES)
def engine_samples(points: pl.DataFrame | Split) -> pl.DataFrame:
    """Engine metric points -> one row per (host, instance, timestamp).

    Input: ``metric_points`` or their :class:`~pipeline.pivot.Split`. Output: ``engine_samples``
    sorted by (host_name, instance_id, ts_ns); the ``*_total`` columns are the cumulative
    counters as sent (consumers diff them with reset handling, see :func:`counter_increase`);
    KV-cache usage is a 0..1 fraction. Beside the table's columns: ``kv_capacity_tokens``
    (vLLM's own KV capacity) and ``requests_finished_total`` / ``requests_aborted_total`` /
    ``requests_errored_total`` (``vllm.requests.finished`` over all reasons, ``abort``,
    ``error``), ``up`` (1 when the agent's scrape worked, 0 when it failed: such a row has
    nothing else), ``unresponsive`` (1 when that failure was a time-out) and
    ``process_start_time_s``; null where the engine does not report them.
    """
    finished = [*_FINISHED.values(), _FINISHED_OTHER]
    wide = _wide(points, _engine_columns,
                 [*ENGINE_METRICS.values(), *ENGINE_EXTRA_METRICS.values(), *finished],
                 [c.HOST_NAME, c.INSTANCE_ID], _describe_instances, (pl.col(c.MODEL).max(),))
    any_reason = pl.any_horizontal(pl.col(finished).is_not_null())
    wide = wide.with_columns(
        pl.when(any_reason).then(pl.sum_horizontal(finished)).alias(c.REQUESTS_FINISHED_TOTAL),
        pl.col(_FINISHED[a.FINISHED_ABORT]).alias(c.REQUESTS_ABORTED_TOTAL),
        pl.col(_FINISHED[a.FINISHED_ERROR]).alias(c.REQUESTS_ERRORED_TOTAL))
    return wide.select(*t.table(t.ENGINE_SAMPLES).columns, *ENGINE_EXTRA_COLUMNS)


#: Columns :func:`engine_samples` writes beside the table's.
ENGINE_EXTRA_COLUMNS = (c.KV_CAPACITY_TOKENS, c.REQUESTS_FINISHED_TOTAL,
                        c.REQUESTS_ABORTED_TOTAL, c.REQUESTS_ERRORED_TOTAL, c.UP,
                        c.PROCESS_START_TIME_S, c.UNRESPONSIVE)


@stage(t.INSTANCE_GPUS)
def instance_gpus(points: pl.DataFrame | Split) -> pl.DataFrame:
    """Which GPUs serve which engine instance, and the instance's model.

    Input: ``metric_points`` (the ``fleetlens.instance.gpus`` gauge and the engine metrics) or
    their :class:`~pipeline.pivot.Split`.
    Output: ``instance_gpus``, one row per (host, instance, model, gpu) seen, with the first and
    last time seen; ``gpu_uuid`` is empty for instances with no mapping gauge.
    """
    slim, combos = as_split(points)
    is_mapping = combos.get_column(c.METRIC_NAME) == a.ENGINE_INSTANCE_GPUS
    mapping = extract_keys(
        _first_last(slim.filter(pl.col(c.VALUE) > 0), combos.filter(is_mapping)), c.ATTRIBUTES, {
            a.ENGINE_INSTANCE: (c.INSTANCE_ID, pl.String()), a.HW_ID: (c.GPU_UUID, pl.String()),
            a.ENGINE_MODEL_NAME: (c.MODEL, pl.String()),
        }).filter(pl.col(c.INSTANCE_ID).is_not_null() & pl.col(c.GPU_UUID).is_not_null())
    engine = combos.filter(_engine_name().is_not_null())
    labelled = _describe_instances(_first_last(slim, engine))
    keys = [c.HOST_NAME, c.INSTANCE_ID, c.MODEL, c.GPU_UUID]
    both = pl.concat([
        mapping.with_columns(pl.col(c.MODEL).fill_null("")).select(*keys, c.START_NS, c.END_NS),
        labelled.with_columns(pl.lit("").alias(c.GPU_UUID)).select(*keys, c.START_NS, c.END_NS),
    ])
    out = both.group_by(keys).agg(pl.col(c.START_NS).min(), pl.col(c.END_NS).max())
    return out.sort(keys).select(list(t.table(t.INSTANCE_GPUS).columns))


def _first_last(slim: pl.DataFrame, combos: pl.DataFrame) -> pl.DataFrame:
    """First and last timestamp of the points of each of the given source combinations."""
    rows = slim.filter(pl.col(SRC).is_in(combos.get_column(SRC).implode()))
    times = rows.group_by(SRC).agg(pl.col(c.TS_NS).min().alias(c.START_NS),
                                   pl.col(c.TS_NS).max().alias(c.END_NS))
    return combos.join(times, on=SRC, how="inner")


def counter_increase(value: pl.Expr, over: list[str]) -> pl.Expr:
    """Increase of a cumulative counter since the previous value of the same series.

    A drop means the counter restarted (process or driver restart): the increase is then the
    new value, as Prometheus ``increase()`` does. Null for a series' first value and for rows
    without one; a row without the counter (a scrape that missed it) does not lose the
    increase across it: the next value is compared with the last one seen.
    """
    diff = value - value.forward_fill().shift(1).over(over)
    return pl.when(diff < 0).then(value).otherwise(diff)
