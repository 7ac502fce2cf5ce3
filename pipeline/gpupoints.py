"""GPU metric points as integer series, prepared once per hour for ``gpu_samples`` and the energy.

At 10 Hz a 64-GPU fleet sends about 4.6M ``hw.power`` and ``hw.energy`` points an hour. They are
never pivoted into wide 10 Hz rows: each point keeps its time, its value (in its column's unit)
and one integer, its *series* (GPU x output column). ``gpu_samples`` downsamples the series to
one row per interval (1 s by default) and the energy stage integrates the native points directly
(:func:`energy_intervals`), so the per-point work is a few passes over three numeric columns.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from fleetlens.pipeline.attrs import extract_keys
from fleetlens.pipeline.pivot import SRC, Split, as_split
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: A point's series: ``gid * len(columns) + index of its column``.
SERIES = "__series"
#: A GPU: its rank in (host_name, gpu_uuid) order.
GID = "__gid"
#: The most power any one GPU draws, with room to spare (10x a 1 kW B200): an energy
#: interval implying more is a broken or hostile reading, not a measurement.
MAX_GPU_POWER_W = 10_000.0
#: One energy interval of a GPU, ``(T0, T1]`` in ns, and the joules measured in it.
T0, T1, JOULES = "__t0", "__t1", "__joules"

#: GPU metric -> output column. ``util_mem`` is the memory controller's busy share.
GPU_METRICS: dict[str, str] = {
    a.HW_POWER: c.POWER_W, a.HW_ENERGY: c.ENERGY_J, a.HW_GPU_UTILIZATION: c.UTIL_GPU,
    a.GPU_MEMORY_CONTROLLER_UTILIZATION: c.UTIL_MEM, a.HW_GPU_MEMORY_USAGE: c.MEM_USED_BYTES,
    a.HW_GPU_MEMORY_LIMIT: c.MEM_TOTAL_BYTES, a.GPU_CLOCK_SM: c.SM_CLOCK_MHZ,
    a.HW_TEMPERATURE: c.TEMP_C, a.GPU_POWER_LIMIT: c.POWER_LIMIT_W,
    a.GPU_CLOCKS_EVENT_REASONS: c.CLOCKS_EVENT_REASONS,
}
#: An energy sum with delta temporality: the energy since the series' previous point.
ENERGY_DELTA = "__energy_delta"
#: The legacy reading of hw.gpu.memory.utilization as the controller's busy share (what the
#: fleetlens agent sent before it followed the conventions, and the simulator still sends):
#: used only for a sample that has no gpu.memory_controller.utilization.
UTIL_MEM_LEGACY = "__util_mem_legacy"
#: Every column a GPU point can go to, in output order.
COLUMNS = [*GPU_METRICS.values(), ENERGY_DELTA, UTIL_MEM_LEGACY]

#: Unit (UCUM, as OTLP sends it) -> factor to the column's unit. Unknown units count as canonical.
UNIT_FACTORS: dict[str, float] = {
    "W": 1.0, "mW": 1e-3, "kW": 1e3,
    "J": 1.0, "mJ": 1e-3, "kJ": 1e3, "Wh": 3600.0, "kWh": 3.6e6,
    "By": 1.0, "KiBy": 1024.0, "MiBy": 1024.0**2, "GiBy": 1024.0**3, "kBy": 1e3, "MBy": 1e6,
    "GBy": 1e9, "1": 1.0, "%": 0.01, "MHz": 1.0, "Hz": 1e-6, "kHz": 1e-3, "GHz": 1e3,
    "Cel": 1.0, "s": 1.0,
}
_COLUMN, _FACTOR = "__column", "__factor"
_UUID, _NAME, _INDEX, _HW_MODEL = "__hw_id", "__hw_name", "__gpu_index", "__hw_model"


class GpuPoints(NamedTuple):
    """One frame's GPU points as integer series (see :func:`gpu_points`)."""

    #: SERIES, ts_ns, value; the points of one series strictly increase in time (repeated
    #: deliveries collapsed), in no particular order between series.
    rows: pl.DataFrame
    #: GID, host_name, gpu_uuid, gpu_model, gpu_index: one row per GPU, by GID.
    gpus: pl.DataFrame
    #: The output column of each column index (only those with points).
    columns: list[str]
    #: Results derived from ``rows`` (the energy intervals), computed once per frame.
    memo: dict

    def only(self, column: str) -> pl.DataFrame | None:
        """The rows of one column (None when no point has it), with GID beside SERIES."""
        if column not in self.columns:
            return None
        n, slot = len(self.columns), self.columns.index(column)
        if n == 1:
            return self.rows.with_columns(pl.col(SERIES).alias(GID))
        return self.rows.filter(pl.col(SERIES) % n == slot).with_columns(
            (pl.col(SERIES) // n).alias(GID))


def _gpu_columns(combos: pl.DataFrame) -> pl.DataFrame:
    """Output column and unit factor of each GPU metric combination (null: not a GPU metric)."""
    is_delta = (pl.col(c.METRIC_NAME) == a.HW_ENERGY) & (pl.col(c.TEMPORALITY) == "delta")
    by_name = {**GPU_METRICS, a.HW_GPU_MEMORY_UTILIZATION: UTIL_MEM_LEGACY}
    column = pl.when(is_delta).then(pl.lit(ENERGY_DELTA)).otherwise(
        pl.col(c.METRIC_NAME).replace_strict(by_name, default=None, return_dtype=pl.String))
    factor = pl.col(c.UNIT).replace_strict(UNIT_FACTORS, default=1.0, return_dtype=pl.Float64)
    return combos.with_columns(column.alias(_COLUMN), factor.alias(_FACTOR))


def gpu_points(points: pl.DataFrame | Split | GpuPoints) -> GpuPoints:
    """The GPU points of ``metric_points`` (or their :class:`~pipeline.pivot.Split`) as series.

    Only the distinct source combinations are parsed (GPU identity from ``hw.id``, model from
    ``hw.model`` else ``hw.name``, index from ``gpu.index``); every point then gets its series
    by one integer lookup. Repeated points of a series at one time (duplicate deliveries)
    collapse to their maximum: the value itself for a duplicate, the latest for a counter.
    """
    if isinstance(points, GpuPoints):
        return points
    slim, combos = as_split(points)
    combos = _gpu_columns(combos).filter(pl.col(_COLUMN).is_not_null())
    combos = extract_keys(combos, c.ATTRIBUTES, {
        a.HW_ID: (_UUID, pl.String()), a.HW_NAME: (_NAME, pl.String()),
        a.HW_MODEL: (_HW_MODEL, pl.String()), a.GPU_INDEX: (_INDEX, pl.Int64()),
    }).with_columns(pl.col(_UUID).fill_null("").alias(c.GPU_UUID))
    series = [c.HOST_NAME, c.GPU_UUID]
    gpus = combos.group_by(series).agg(
        # The model: hw.model (the conventions' attribute for it), else hw.name (older agents).
        pl.coalesce(pl.col(_HW_MODEL).drop_nulls().max(), pl.col(_NAME).drop_nulls().max())
        .fill_null("").alias(c.GPU_MODEL),
        pl.col(_INDEX).drop_nulls().min().alias(c.GPU_INDEX),
    ).sort(series, nulls_last=False).with_row_index(GID).with_columns(pl.col(GID).cast(pl.Int64))
    seen = set(combos.get_column(_COLUMN).to_list())
    columns = [col for col in COLUMNS if col in seen]
    gpus = gpus.select(GID, *series, c.GPU_MODEL, c.GPU_INDEX)
    if not columns:
        rows = pl.DataFrame(schema={SERIES: pl.Int64, c.TS_NS: pl.Int64, c.VALUE: pl.Float64})
        return GpuPoints(rows, gpus, columns, {})
    combos = combos.join(gpus.select(*series, GID), on=series, how="left", nulls_equal=True)
    combos = combos.with_columns(
        (pl.col(GID) * len(columns) + pl.col(_COLUMN).replace_strict(
            columns, list(range(len(columns))), return_dtype=pl.Int64)).alias(SERIES))
    # Each source's points in their order, then the sources in series order: the points come
    # out sorted by series without sorting them (a source is one series; a series usually
    # has one source).
    per_source = slim.group_by(SRC).agg(c.TS_NS, c.VALUE).join(
        combos.select(SRC, SERIES, _FACTOR), on=SRC, how="inner").sort(SERIES)
    rows = per_source.explode([c.TS_NS, c.VALUE])
    if not (per_source.get_column(_FACTOR) == 1.0).all():
        rows = rows.with_columns(pl.col(c.VALUE) * pl.col(_FACTOR))
    rows = rows.select(SERIES, pl.col(c.TS_NS).cast(pl.Int64), pl.col(c.VALUE).cast(pl.Float64))
    return GpuPoints(_in_order(rows), gpus, columns, {})


def _in_order(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (sorted by series) with every series strictly increasing in time.

    An agent sends a GPU's points in time order, so they usually already are: one pass proves
    it. Otherwise (late or repeated deliveries, a series with several sources) sort, keeping
    the maximum of repeated points."""
    same = pl.col(SERIES) == pl.col(SERIES).shift(1)
    if rows.select((~same | (pl.col(c.TS_NS).diff() > 0)).all()).item():
        return rows
    return rows.group_by(SERIES, c.TS_NS).agg(pl.col(c.VALUE).max()).sort(SERIES, c.TS_NS)


def previous(expr: pl.Expr) -> pl.Expr:
    """``expr`` at the series' previous point (rows sorted by series, then time)."""
    return pl.when(pl.col(SERIES) == pl.col(SERIES).shift(1)).then(expr.shift(1))


def energy_intervals(gp: GpuPoints, max_gap_s: float) -> list[pl.DataFrame]:
    """Each GPU's energy per native sample interval: frames of GID, T0, T1 (ns, ``(T0, T1]``)
    and JOULES, each sorted by (GID, T1) (one per source; concatenated they are not sorted).

    Per GPU, the best source it has in the frame: energy sums with delta temporality (the
    point's value; T0 is the series' previous point, null for its first), else the cumulative
    counter (the increase since the previous point; a drop means the counter restarted and the
    increase is the new value), else the trapezoid of ``hw.power``. Power also fills the time
    before the first and after the last interval of a GPU's counter. Counter and power
    intervals longer than ``max_gap_s`` are not measured (null energy is no energy).
    """
    key = ("energy", max_gap_s)
    if key not in gp.memo:
        gp.memo[key] = _energy_intervals(gp, max_gap_s * NS)
    return gp.memo[key]


def _intervals(rows: pl.DataFrame, joules: pl.Expr, gap_ns: float | None) -> pl.DataFrame:
    """(previous point, point] of each series with ``joules`` (of VALUE and __prev)."""
    rows = rows.with_columns(previous(pl.col(c.TS_NS)).alias(T0),
                             previous(pl.col(c.VALUE)).alias("__prev"))
    if gap_ns is not None:
        rows = rows.filter(pl.col(c.TS_NS) - pl.col(T0) <= gap_ns)
    return rows.select(GID, T0, pl.col(c.TS_NS).alias(T1), joules.alias(JOULES))


def _plausible(intervals: pl.DataFrame, gap_ns: float) -> pl.DataFrame:
    """The intervals whose joules a GPU could have drawn: at most :data:`MAX_GPU_POWER_W` over
    the interval (over one sample gap for a delta sum's first point, whose start is unknown).
    A NaN, an infinity or a counter that jumped by 1e300 is no measurement (null energy), and
    would otherwise fail the integer µJ of its slot, and so the hour, on every run."""
    seconds = pl.coalesce((pl.col(T1) - pl.col(T0)) / NS, pl.lit(gap_ns / NS))
    joules = pl.col(JOULES)
    return intervals.filter(joules.is_null() | (joules.abs() <= MAX_GPU_POWER_W * seconds))


def _reach(frame: pl.DataFrame, lo: pl.Expr, hi: pl.Expr) -> pl.DataFrame:
    """Per GPU of a frame sorted by GID: the smallest ``lo`` and largest ``hi``."""
    return frame.with_columns(pl.col(GID).set_sorted()).group_by(GID, maintain_order=True).agg(
        lo.min().alias("__lo"), hi.max().alias("__hi"))


def _energy_intervals(gp: GpuPoints, gap_ns: float) -> list[pl.DataFrame]:
    value, prev = pl.col(c.VALUE), pl.col("__prev")
    measured = []
    if (delta := gp.only(ENERGY_DELTA)) is not None:
        measured.append(_plausible(_intervals(delta, value, None), gap_ns))
    if (counter := gp.only(c.ENERGY_J)) is not None:
        if measured:  # a GPU sending delta sums is measured by them alone
            counter = counter.filter(~pl.col(GID).is_in(measured[0].get_column(GID).implode()))
        measured.append(_plausible(_intervals(counter, pl.when(value < prev).then(value)
                                              .otherwise(value - prev), gap_ns), gap_ns))
    power = gp.only(c.POWER_W)
    if power is None:
        return measured
    # Power only where no better source measured: GPUs without one, and the time outside the
    # span of the GPU's measured intervals (usually none: agents send both at every sample,
    # and then no power interval is even computed).
    span = pl.concat([_reach(m, pl.coalesce(T0, T1), pl.col(T1)) for m in measured]
                     or [pl.DataFrame(schema={GID: pl.Int64, "__lo": pl.Int64,
                                              "__hi": pl.Int64})])
    reach = _reach(power, pl.col(c.TS_NS), pl.col(c.TS_NS))
    inside = reach.join(span, on=GID, how="inner", suffix="_m").filter(
        (pl.col("__lo") >= pl.col("__lo_m")) & (pl.col("__hi") <= pl.col("__hi_m")))
    power = power.filter(~pl.col(GID).is_in(inside.get_column(GID).implode()))
    if power.height == 0:
        return measured
    power = _plausible(_intervals(
        power, (value + prev) / 2 * (pl.col(c.TS_NS) - pl.col(T0)) / NS, gap_ns), gap_ns)
    power = power.join(span, on=GID, how="left", maintain_order="left").filter(
        pl.col("__lo").is_null() | (pl.col(T1) <= pl.col("__lo"))
        | (pl.col(T0) >= pl.col("__hi"))).select(GID, T0, T1, JOULES)
    return [*measured, power]
