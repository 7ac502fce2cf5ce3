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

from pipeline.attrs import code, extract_keys
from pipeline.schema import attributes as a
from pipeline.schema import columns as c
from pipeline.schema import tables as t
from pipeline.stage import stage

_NS = 1_000_000_000

#: GPU metric -> gpu_samples column.
GPU_METRICS: dict[str, str] = {
    a.HW_POWER: c.POWER_W, a.HW_ENERGY: c.ENERGY_J, a.HW_GPU_UTILIZATION: c.UTIL_GPU,
    a.HW_GPU_MEMORY_UTILIZATION: c.UTIL_MEM, a.HW_GPU_MEMORY_USAGE: c.MEM_USED_BYTES,
    a.HW_GPU_MEMORY_LIMIT: c.MEM_TOTAL_BYTES, a.GPU_CLOCK_SM: c.SM_CLOCK_MHZ,
    a.HW_TEMPERATURE: c.TEMP_C, a.GPU_POWER_LIMIT: c.POWER_LIMIT_W,
    a.GPU_CLOCKS_EVENT_REASONS: c.CLOCKS_EVENT_REASONS,
}
#: Engine metric -> engine_samples column.
ENGINE_METRICS: dict[str, str] = {
    a.ENGINE_KV_CACHE_USAGE: c.KV_CACHE_USAGE, a.ENGINE_NUM_RUNNING: c.NUM_RUNNING,
    a.ENGINE_NUM_WAITING: c.NUM_WAITING, a.ENGINE_PREEMPTIONS: c.PREEMPTIONS_TOTAL,
    a.ENGINE_PREFIX_CACHE_QUERIES: c.PREFIX_CACHE_QUERIES_TOTAL,
    a.ENGINE_PREFIX_CACHE_HITS: c.PREFIX_CACHE_HITS_TOTAL,
    a.ENGINE_PROMPT_TOKENS: c.PROMPT_TOKENS_TOTAL,
    a.ENGINE_GENERATION_TOKENS: c.GENERATION_TOKENS_TOTAL,
}
#: Every accepted engine metric name (ours and vLLM's, old and new) -> our name.
ENGINE_ALIASES: dict[str, str] = {
    **{name: name for name in ENGINE_METRICS},
    **{alias: ours for ours, aliases in a.VLLM_PROMETHEUS_NAMES.items() for alias in aliases},
}

#: Unit (UCUM, as OTLP sends it) -> factor to the column's unit. Unknown units count as canonical.
UNIT_FACTORS: dict[str, float] = {
    "W": 1.0, "mW": 1e-3, "kW": 1e3,
    "J": 1.0, "mJ": 1e-3, "kJ": 1e3, "Wh": 3600.0, "kWh": 3.6e6,
    "By": 1.0, "KiBy": 1024.0, "MiBy": 1024.0**2, "GiBy": 1024.0**3, "kBy": 1e3, "MBy": 1e6,
    "GBy": 1e9, "1": 1.0, "%": 0.01, "MHz": 1.0, "Hz": 1e-6, "kHz": 1e-3, "GHz": 1e3,
    "Cel": 1.0, "s": 1.0,
}

_DELTA = "delta"
_ENERGY_DELTA = "__energy_delta"
_UUID, _NAME, _INDEX, _INSTANCE, _MODEL_LABEL = (
    "__hw_id", "__hw_name", "__gpu_index", "__instance", "__model_label")


def normalised_value() -> pl.Expr:
    """The point's value in the canonical unit of its metric."""
    factor = pl.col(c.UNIT).replace_strict(UNIT_FACTORS, default=1.0, return_dtype=pl.Float64)
    return pl.col(c.VALUE) * factor


GROUP = "__group"
_PACK_BITS = 43
_PACK_TS = 1 << _PACK_BITS  # ns: about 2.4 hours of timestamps packed beside the series rank


_SOURCE = [c.HOST_NAME, c.SERVICE_NAME, c.ATTRIBUTES]
_SOURCE_CODES = ["__h", "__s", "__a"]


def _wide(points: pl.DataFrame, metrics: dict[str, str], series: list[str],
          describe: Callable[[pl.DataFrame], pl.DataFrame],
          labels: tuple[pl.Expr, ...] = ()) -> pl.DataFrame:
    """One row per (series, ts_ns) with one column per metric, sorted by series then time.

    A point's series comes from its (host, service, attributes) combination: ``describe`` gets
    the distinct combinations (a few per GPU or instance) and adds the ``series`` columns and
    whatever ``labels`` aggregate per series. Only integer codes of the combinations touch the
    per-point rows, and (series rank, time) is packed into one int64 so the grouping and the
    sort run on a single integer column. Repeated points of one metric at one key (duplicate
    deliveries) collapse to their maximum: the value itself for a duplicate, the latest value
    for a counter. The result carries :data:`GROUP`, the series' rank in sorted order, for
    ``shift``-based per-series computations.
    """
    present = set(points.get_column(c.METRIC_NAME).unique().to_list())
    value_cols = [col for name, col in metrics.items() if name in present]
    frame = points.with_columns(
        *[code(col).alias(k) for col, k in zip(_SOURCE, _SOURCE_CODES, strict=True)],
        *[pl.when(pl.col(c.METRIC_NAME) == name).then(pl.col(c.VALUE)).alias(column)
          for name, column in metrics.items() if name in present])
    combos = describe(frame.group_by(_SOURCE_CODES).agg(pl.col(_SOURCE).first()))
    ranks = (combos.group_by(series).agg(*labels).sort(series).with_row_index(GROUP)
             .with_columns(pl.col(GROUP).cast(pl.Int64)))
    combos = combos.join(ranks.select(*series, GROUP), on=series, how="left", nulls_equal=True)
    frame = frame.select(*_SOURCE_CODES, c.TS_NS, *value_cols).join(
        combos.select(*_SOURCE_CODES, GROUP), on=_SOURCE_CODES, how="left", nulls_equal=True)
    base = int(frame.get_column(c.TS_NS).min() or 0)
    span = int(frame.get_column(c.TS_NS).max() or 0) - base
    if span < _PACK_TS and ranks.height < (1 << (62 - _PACK_BITS)):
        packed = pl.col(GROUP) * _PACK_TS + (pl.col(c.TS_NS) - base)
        wide = (frame.group_by(packed.alias("__key")).agg(pl.col(value_cols).max())
                .sort("__key").with_columns(
                    (pl.col("__key") // _PACK_TS).alias(GROUP),
                    (pl.col("__key") % _PACK_TS + base).alias(c.TS_NS)).drop("__key"))
    else:  # more than ~2.4 hours or 500k series in one frame: group on two integer columns
        wide = frame.group_by(GROUP, c.TS_NS).agg(pl.col(value_cols).max()).sort(
            GROUP, c.TS_NS)
    wide = wide.join(ranks, on=GROUP, how="left", maintain_order="left")
    missing = [pl.lit(None, pl.Float64).alias(col) for name, col in metrics.items()
               if name not in present]
    return wide.with_columns(missing)


def _previous(expr: pl.Expr) -> pl.Expr:
    """The value of the previous row of the same series (rows sorted by series, then time)."""
    return pl.when(pl.col(GROUP) == pl.col(GROUP).shift(1)).then(expr.shift(1))


@stage(t.GPU_SAMPLES)
def gpu_samples(points: pl.DataFrame, max_gap_s: float) -> pl.DataFrame:
    """GPU metric points -> one row per (host, GPU, timestamp).

    Input: ``metric_points`` (deduplicated or not; other metrics are ignored). Output:
    ``gpu_samples`` sorted by (host_name, gpu_uuid, ts_ns), plus ``mem_total_bytes`` and
    ``energy_delta_j``: the GPU's energy since its previous sample: the point's value for an
    energy sum with delta temporality, else the counter's increase (a drop means the counter
    restarted: the increase is then the new value), else the trapezoid of power; null for a
    GPU's first sample or across a gap longer than ``max_gap_s``.
    """
    # Duplicate deliveries collapse in the pivot below (no sort needed).
    gpu = points.filter(pl.col(c.METRIC_NAME).is_in(list(GPU_METRICS)))
    gpu = gpu.with_columns(normalised_value().alias(c.VALUE))
    # An energy sum with delta temporality already holds the energy since the last point.
    is_delta = (pl.col(c.METRIC_NAME) == a.HW_ENERGY) & (pl.col(c.TEMPORALITY) == _DELTA)
    gpu = gpu.with_columns(pl.when(is_delta).then(pl.lit(_ENERGY_DELTA))
                           .otherwise(pl.col(c.METRIC_NAME)).alias(c.METRIC_NAME))

    def describe(combos: pl.DataFrame) -> pl.DataFrame:
        combos = extract_keys(combos, c.ATTRIBUTES, {
            a.HW_ID: (_UUID, pl.String()), a.HW_NAME: (_NAME, pl.String()),
            a.GPU_INDEX: (_INDEX, pl.Int64()),
        })
        return combos.with_columns(pl.col(_UUID).fill_null("").alias(c.GPU_UUID))

    labels = (pl.col(_NAME).drop_nulls().max().fill_null("").alias(c.GPU_MODEL),
              pl.col(_INDEX).drop_nulls().min().alias(c.GPU_INDEX))
    wide = _wide(gpu, {**GPU_METRICS, _ENERGY_DELTA: _ENERGY_DELTA},
                 [c.HOST_NAME, c.GPU_UUID], describe, labels)
    wide = wide.with_columns(pl.col(c.CLOCKS_EVENT_REASONS).cast(pl.Int64))
    dt_s = (pl.col(c.TS_NS) - _previous(pl.col(c.TS_NS))) / _NS
    increase = pl.col(c.ENERGY_J) - _previous(pl.col(c.ENERGY_J))
    counter = pl.when(increase < 0).then(pl.col(c.ENERGY_J)).otherwise(increase)
    trapezoid = (pl.col(c.POWER_W) + _previous(pl.col(c.POWER_W))) / 2 * dt_s
    delta = pl.coalesce(
        pl.col(_ENERGY_DELTA), pl.when(dt_s <= max_gap_s).then(pl.coalesce(counter, trapezoid)))
    wide = wide.with_columns(delta.alias(c.ENERGY_DELTA_J))
    columns = [*t.table(t.GPU_SAMPLES).columns, c.MEM_TOTAL_BYTES, c.ENERGY_DELTA_J]
    return wide.select(columns)


def _engine_points(points: pl.DataFrame) -> pl.DataFrame:
    """The engine metric points, under our metric names."""
    eng = points.filter(pl.col(c.METRIC_NAME).is_in(list(ENGINE_ALIASES)))
    return eng.with_columns(pl.col(c.METRIC_NAME).replace_strict(ENGINE_ALIASES))


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
def engine_samples(points: pl.DataFrame) -> pl.DataFrame:
    """Engine metric points -> one row per (host, instance, timestamp).

    Input: ``metric_points``. Output: ``engine_samples`` sorted by (host_name, instance_id,
    ts_ns); the ``*_total`` columns are the cumulative counters as sent (consumers diff them
    with reset handling, see :func:`counter_increase`); KV-cache usage is a 0..1 fraction.
    """
    eng = _engine_points(points)
    eng = eng.with_columns(
        pl.when(pl.col(c.UNIT) == "%").then(pl.col(c.VALUE) / 100).otherwise(pl.col(c.VALUE))
        .alias(c.VALUE))
    wide = _wide(eng, ENGINE_METRICS, [c.HOST_NAME, c.INSTANCE_ID], _describe_instances,
                 (pl.col(c.MODEL).max(),))
    return wide.select(list(t.table(t.ENGINE_SAMPLES).columns))


@stage(t.INSTANCE_GPUS)
def instance_gpus(points: pl.DataFrame) -> pl.DataFrame:
    """Which GPUs serve which engine instance, and the instance's model.

    Input: ``metric_points`` (the ``fleetlens.instance.gpus`` gauge and the engine metrics).
    Output: ``instance_gpus``, one row per (host, instance, model, gpu) seen, with the first and
    last time seen; ``gpu_uuid`` is empty for instances with no mapping gauge.
    """
    is_mapping = (pl.col(c.METRIC_NAME) == a.ENGINE_INSTANCE_GPUS) & (pl.col(c.VALUE) > 0)
    mapping = extract_keys(_first_last(points.filter(is_mapping)), c.ATTRIBUTES, {
        a.ENGINE_INSTANCE: (c.INSTANCE_ID, pl.String()), a.HW_ID: (c.GPU_UUID, pl.String()),
        a.ENGINE_MODEL_NAME: (c.MODEL, pl.String()),
    }).filter(pl.col(c.INSTANCE_ID).is_not_null() & pl.col(c.GPU_UUID).is_not_null())
    labelled = _describe_instances(_first_last(_engine_points(points)))
    keys = [c.HOST_NAME, c.INSTANCE_ID, c.MODEL, c.GPU_UUID]
    both = pl.concat([
        mapping.with_columns(pl.col(c.MODEL).fill_null("")).select(*keys, c.START_NS, c.END_NS),
        labelled.with_columns(pl.lit("").alias(c.GPU_UUID)).select(*keys, c.START_NS, c.END_NS),
    ])
    out = both.group_by(keys).agg(pl.col(c.START_NS).min(), pl.col(c.END_NS).max())
    return out.sort(keys).select(list(t.table(t.INSTANCE_GPUS).columns))


def _first_last(points: pl.DataFrame) -> pl.DataFrame:
    """First and last timestamp per distinct (host, service, attributes) combination."""
    codes = [code(col).alias(k) for col, k in zip(_SOURCE, _SOURCE_CODES, strict=True)]
    return points.group_by(codes).agg(
        pl.col(_SOURCE).first(), pl.col(c.TS_NS).min().alias(c.START_NS),
        pl.col(c.TS_NS).max().alias(c.END_NS))


def counter_increase(value: pl.Expr, over: list[str]) -> pl.Expr:
    """Increase of a cumulative counter since the previous row of the same series.

    A drop means the counter restarted (process or driver restart): the increase is then the
    new value, as Prometheus ``increase()`` does. Null for a series' first row.
    """
    diff = value - value.shift(1).over(over)
    return pl.when(diff < 0).then(value).otherwise(diff)
