"""Stages ``engine_configs`` and ``gpu_health``: raw ``metric_points`` -> what changed.

Both read the agent's low-rate series (issue 30): an engine's configuration gauge, whose
value is always 1 and whose point attributes are the configuration, and the GPU health
series (Xid counts per code, ECC counts, remapped rows, GPU lost). They are few and change
rarely, so the stages keep what changed, not every reading.
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.attrs import extract_keys
from fleetlens.pipeline.pivot import SRC, Split, as_split
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.stage import stage

#: GPU health metric -> the ``signal`` of its rows, and the attribute that details it.
HEALTH_SIGNALS: dict[str, tuple[str, tuple[str, ...]]] = {
    a.GPU_XID_ERRORS: ("xid_errors", (a.GPU_XID_CODE,)),
    a.GPU_ECC_ERRORS: ("ecc_errors", (a.GPU_ECC_TYPE, a.GPU_ECC_COUNTER)),
    a.GPU_REMAPPED_ROWS: ("remapped_rows", (a.GPU_REMAP_KIND,)),
    a.GPU_LOST: ("lost", ()),
}
_DETAIL_KEYS = sorted({key for _, keys in HEALTH_SIGNALS.values() for key in keys})


def _points_of(split: Split, names: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The combinations of the metrics ``names`` and their points (ts_ns, value, SRC)."""
    combos = split.combos.filter(pl.col(c.METRIC_NAME).is_in(names))
    if combos.is_empty():  # an older agent, or none: no pass over the hour's points
        return combos, split.slim.clear()
    points = split.slim.filter(pl.col(SRC).is_in(combos.get_column(SRC).implode()))
    return combos, points


@stage(t.ENGINE_CONFIGS)
def engine_configs(points: pl.DataFrame | Split) -> pl.DataFrame:
    """The configuration gauge -> one row per run of one configuration on one engine (its
    first and last time seen in a row).

    Input: ``metric_points`` or their :class:`~pipeline.pivot.Split`. Output:
    ``engine_configs`` sorted by (host, instance, start). A configuration that comes back
    (a rollback) is a run of its own, so the change back is at the right time. Points
    without an instance or a fingerprint are no configuration and are left out.
    """
    split = as_split(points)
    combos, rows = _points_of(split, [a.ENGINE_CONFIG_INFO])
    keys = {a.ENGINE_INSTANCE: (c.INSTANCE_ID, pl.String()),
            a.ENGINE_MODEL_NAME: (c.MODEL, pl.String()),
            a.ENGINE_CONFIG_FINGERPRINT: (c.CONFIG_FINGERPRINT, pl.String()),
            a.ENGINE_VERSION: (c.ENGINE_VERSION, pl.String()),
            a.ENGINE_CONFIG_JSON: (c.CONFIG_JSON, pl.String())}
    combos = extract_keys(combos, c.ATTRIBUTES, keys).filter(
        pl.col(c.INSTANCE_ID).is_not_null() & pl.col(c.CONFIG_FINGERPRINT).is_not_null())
    engine = [c.HOST_NAME, c.INSTANCE_ID]
    seen = (rows.join(combos.select(SRC, *engine, c.MODEL, c.CONFIG_FINGERPRINT,
                                    c.ENGINE_VERSION, c.CONFIG_JSON), on=SRC, how="inner")
            .with_columns(pl.col(c.MODEL).fill_null(""))
            .sort(*engine, c.TS_NS, c.CONFIG_FINGERPRINT))
    fingerprint = pl.col(c.CONFIG_FINGERPRINT)
    run = (fingerprint != fingerprint.shift(1)).fill_null(True).cum_sum().over(engine)
    out = (seen.with_columns(run.alias("__run"))
           .group_by(*engine, "__run")
           .agg(pl.col(c.MODEL).max(), fingerprint.first(), pl.col(c.ENGINE_VERSION).first(),
                pl.col(c.CONFIG_JSON).first(), pl.col(c.TS_NS).min().alias(c.START_NS),
                pl.col(c.TS_NS).max().alias(c.END_NS)))
    return out.sort(*engine, c.START_NS).select(list(t.table(t.ENGINE_CONFIGS).columns))


@stage(t.GPU_HEALTH)
def gpu_health(points: pl.DataFrame | Split) -> pl.DataFrame:
    """GPU health series -> their readings where the value changed (and each series' first).

    Input: ``metric_points`` or their :class:`~pipeline.pivot.Split`. Output: ``gpu_health``
    sorted by (host, gpu, signal, detail, time); ``detail`` joins the series' detailing
    attributes (``79``, ``uncorrected/volatile``, ``pending``). Repeated deliveries of a
    reading collapse.
    """
    split = as_split(points)
    combos, rows = _points_of(split, list(HEALTH_SIGNALS))
    keys = {a.HW_ID: (c.GPU_UUID, pl.String())}
    keys.update({key: (f"__detail_{i}", pl.String()) for i, key in enumerate(_DETAIL_KEYS)})
    combos = extract_keys(combos, c.ATTRIBUTES, keys).filter(pl.col(c.GPU_UUID).is_not_null())
    signal = pl.col(c.METRIC_NAME).replace_strict(
        {name: sig for name, (sig, _) in HEALTH_SIGNALS.items()}, return_dtype=pl.String)
    detail = pl.concat_str([pl.col(f"__detail_{i}") for i in range(len(_DETAIL_KEYS))],
                           separator="/", ignore_nulls=True)
    combos = combos.with_columns(signal.alias(c.SIGNAL), detail.alias(c.DETAIL)).select(
        SRC, c.HOST_NAME, c.GPU_UUID, c.SIGNAL, c.DETAIL)
    series = [c.HOST_NAME, c.GPU_UUID, c.SIGNAL, c.DETAIL]
    out = (rows.join(combos, on=SRC, how="inner")
           .group_by(*series, c.TS_NS).agg(pl.col(c.VALUE).max())
           .sort(*series, c.TS_NS))
    changed = (pl.col(c.VALUE) != pl.col(c.VALUE).shift(1)).over(series).fill_null(True)
    return out.filter(changed).select(list(t.table(t.GPU_HEALTH).columns))
