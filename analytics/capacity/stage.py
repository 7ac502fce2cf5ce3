"""Stage ``capacity``: elasticity points -> one row per pool, and the fitted curves.

Input: `capacity_windows` with ``mbu``/``mfu`` (:mod:`.points`, :mod:`.utilisation`) and
`requests` (each request judged against its pool's SLOs). Output: `capacity` (one row per
(service, model, GPU model, TP, configuration)), `capacity_curve` (each pool's fit on a grid
of batches), and the points with ``good_requests`` (`capacity_windows`). A pool with fewer
than ``min_windows`` usable windows gets a row with its counts and ``knee_limit``
``insufficient``, never a guessed knee.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from fleetlens.analytics.capacity.energy import POWER, j_per_token_at
from fleetlens.analytics.capacity.knee import Knee, Pool, find_knee, rps_at, slo_thresholds
from fleetlens.analytics.capacity.points import (
    GEN_TOK_S,
    KV_CAPACITY,
    MEAN_OUTPUT,
    MEAN_PREFILL,
    NS,
    STEADY,
    TTFT99_ARRIVED,
    latency_window,
)
from fleetlens.analytics.capacity.utilisation import verdict
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

POOL = [c.SERVICE_NAME, c.MODEL, c.GPU_MODEL, c.TP, c.CONFIG]
INSUFFICIENT = "insufficient"
_TPOT50, _TPOT99 = c.percentile_column("tpot", "p50"), c.percentile_column("tpot", "p99")
_TTFT99 = c.percentile_column("ttft", "p99")
CURVE_POINTS = 40


@dataclass
class CapacityTables:
    """What the capacity stage produced."""

    capacity: pl.DataFrame
    curve: pl.DataFrame
    windows: pl.DataFrame


def _usable(points: pl.DataFrame, config: AnalyticsConfig) -> pl.DataFrame:
    return points.filter((pl.col(c.REQUESTS) >= config.capacity.min_requests)
                         & (pl.col(c.BATCH) >= 0.5) & pl.col(_TPOT50).is_not_null()
                         & pl.col(_TPOT99).is_not_null() & pl.col(_TTFT99).is_not_null()
                         & pl.col(c.KV_TOKENS).is_not_null())


def _pool(rows: pl.DataFrame) -> Pool:
    def arr(name: str) -> np.ndarray:
        return rows[name].cast(pl.Float64).fill_null(float("nan")).to_numpy()

    weights = arr(c.REQUESTS)
    capacity = rows[KV_CAPACITY].drop_nulls()
    return Pool(batch=arr(c.BATCH), kv=arr(c.KV_TOKENS), tpot_p50=arr(_TPOT50),
                tpot_p99=arr(_TPOT99), ttft_p99=arr(TTFT99_ARRIVED), requests=weights,
                steady=rows[STEADY].fill_null(True).to_numpy(),
                context=float(np.sum(arr(c.KV_TOKENS)) / np.sum(arr(c.BATCH))),
                output=float(np.average(arr(MEAN_OUTPUT), weights=weights)),
                prefill_s=float(np.average(np.nan_to_num(arr(MEAN_PREFILL)), weights=weights)),
                kv_capacity=float(capacity.median()) if capacity.len() else None)


def _good(points: pl.DataFrame, requests: pl.LazyFrame, slos: pl.DataFrame) -> pl.DataFrame:
    """``good_requests`` per point: its requests meeting the pool's TPOT and TTFT SLOs (a
    one-token answer has no TPOT and meets that SLO)."""
    window_s = int(points[c.WINDOW_S][0])
    keys = [c.HOST_NAME, c.INSTANCE_ID, c.WINDOW_START_NS]
    # only the columns judged: a requests table may carry its own service, model or (null)
    # GPU model, which would shadow the pool's in the join and match no SLO row
    judged = (requests.filter(~pl.col(c.IS_ERROR).fill_null(False))
              .with_columns(latency_window(window_s))
              .select(*keys, c.TPOT_S, c.TTFT_S)
              .join(points.lazy().select(*keys, *POOL), on=keys)
              .join(slos.lazy(), on=POOL)
              .group_by(keys).agg(((pl.col(c.TPOT_S).is_null()
                                    | (pl.col(c.TPOT_S) <= pl.col(c.TPOT_SLO_S)))
                                   & (pl.col(c.TTFT_S) <= pl.col(c.TTFT_SLO_S)))
                                  .sum().cast(pl.Int64).alias(c.GOOD_REQUESTS))
              .collect())
    return points.join(judged, on=keys, how="left").with_columns(
        pl.col(c.GOOD_REQUESTS).fill_null(0))


def _attainment(rows: pl.DataFrame, knee: float, rel: float) -> float | None:
    """Share of requests meeting every SLO in the windows just under the knee batch (else
    in all windows under it): above it the SLO is broken by definition."""
    near = rows.filter(pl.col(c.BATCH).is_between(knee * (1 - rel), knee))
    if near[c.REQUESTS].sum() == 0:
        near = rows.filter(pl.col(c.BATCH) <= knee)
    total = near[c.REQUESTS].sum()
    return near[c.GOOD_REQUESTS].sum() / total if total else None


def _j_per_token(rows: pl.DataFrame, knee: Knee, pool: Pool, rel: float) -> float | None:
    """J/token at the knee (:mod:`.energy`) from the pool's instance-windows."""
    if POWER not in rows.columns:
        return None

    def arr(name: str) -> np.ndarray:
        return rows[name].cast(pl.Float64).fill_null(float("nan")).to_numpy()

    return j_per_token_at(arr(c.BATCH), arr(POWER), arr(GEN_TOK_S), knee.batch,
                          float(knee.p50.at(knee.batch, pool.context)), rel)


def _curve(key: dict, knee: Knee, pool: Pool, ts_ns: int, rel: float) -> list[dict]:
    top = max(knee.hi, float(pool.batch.max())) * 1.2
    grid = np.unique(np.round(np.linspace(1.0, max(top, 2.0), CURVE_POINTS), 2))
    band = np.array([line.at(grid, pool.context) for line in knee.lines])
    lo, hi = np.percentile(band, 5, axis=0), np.percentile(band, 95, axis=0)
    seen = pool.batch
    rows = []
    for i, b in enumerate(grid):
        rows.append({**key, c.TS_NS: ts_ns, c.BATCH: float(b),
                     c.TPOT_P50_FIT_S: float(knee.p50.at(b, pool.context)),
                     c.TPOT_P99_FIT_S: float(knee.p99.at(b, pool.context)),
                     c.TPOT_BAND_LO_S: float(lo[i]), c.TPOT_BAND_HI_S: float(hi[i]),
                     c.RPS: float(rps_at(b, knee.p50, pool)),
                     c.VISITED: bool(np.any(np.abs(seen - b) <= rel * b))})
    return rows


def _now(rows: pl.DataFrame, since_ns: int, window_s: int) -> dict:
    now = rows.filter(pl.col(c.WINDOW_START_NS) >= since_ns)
    if now.is_empty():
        return {c.RPS_NOW: None, c.BATCH_NOW: None, c.GOODPUT_NOW_RPS_PER_GPU: None,
                c.MBU: None, c.MFU: None, c.INSTANCES: 0}
    spans = now[c.WINDOW_START_NS].n_unique() * window_s
    gpu_s = now.height * window_s * float(now[c.TP].mean())
    return {c.RPS_NOW: now[c.REQUESTS].sum() / spans, c.BATCH_NOW: now[c.BATCH].mean(),
            c.GOODPUT_NOW_RPS_PER_GPU: now[c.GOOD_REQUESTS].sum() / gpu_s,
            c.MBU: now[c.MBU].mean(), c.MFU: now[c.MFU].mean(),
            c.INSTANCES: now[c.INSTANCE_ID].n_unique()}


def capacity(points: pl.LazyFrame, requests: pl.LazyFrame, config: AnalyticsConfig
             ) -> CapacityTables:
    """Stage: capacity_windows (+ requests) -> capacity, capacity_curve, capacity_windows."""
    cap = config.capacity
    # One order whatever order the files were read in (an s3:// and a local copy of the same
    # data listed them differently): the fits' sums and the bootstrap's draws follow it.
    frame = points.collect().sort(c.WINDOW_START_NS, c.HOST_NAME, c.INSTANCE_ID)
    if frame.is_empty():
        return CapacityTables(t.table(t.CAPACITY).empty(), t.table(t.CAPACITY_CURVE).empty(),
                              t.table(t.CAPACITY_WINDOWS).empty())
    window_s = int(frame[c.WINDOW_S][0])
    ts_ns = int(frame[c.WINDOW_START_NS].max()) + window_s * NS
    since = ts_ns - cap.now_s * NS
    usable = _usable(frame, config)
    knees: dict[tuple, tuple[Knee, Pool]] = {}
    slo_rows = []
    for key, rows in usable.group_by(POOL, maintain_order=True):
        if rows.height < cap.min_windows:
            continue
        pool = _pool(rows)
        tpot_slo, ttft_slo = slo_thresholds(str(key[0]), config.slos, cap)
        knee = find_knee(pool, tpot_slo, ttft_slo, cap)
        knees[key] = (knee, pool)
        slo_rows.append({**dict(zip(POOL, key, strict=True)), c.TPOT_SLO_S: knee.tpot_slo_s,
                         c.TTFT_SLO_S: knee.ttft_slo_s})
    slos = pl.DataFrame(slo_rows, schema={**{k: frame.schema[k] for k in POOL},
                                          c.TPOT_SLO_S: pl.Float64, c.TTFT_SLO_S: pl.Float64})
    frame = _good(frame, requests, slos)
    out, curve = [], []
    for key, rows in frame.group_by(POOL, maintain_order=True):
        named = dict(zip(POOL, key, strict=True))
        row = {**named, c.TS_NS: ts_ns, c.WINDOW_S: window_s,
               c.WINDOWS_USED: usable.filter(pl.all_horizontal(
                   [pl.col(k) == v for k, v in named.items()])).height,
               c.BATCH_MIN: rows[c.BATCH].min(), c.BATCH_MAX: rows[c.BATCH].max(),
               **_now(rows, since, window_s)}
        row[c.BOUND], row[c.ROOFLINE_GAP] = verdict(row[c.MBU], row[c.MFU],
                                                    cap.compute_bound_ratio)
        found = knees.get(key)
        if found is None:  # no TPOT SLO without a batch-1 value: no request judged good
            out.append({**row, c.KNEE_LIMIT: INSUFFICIENT, c.GOODPUT_NOW_RPS_PER_GPU: None})
            continue
        knee, pool = found
        tp = int(named[c.TP] or 1)
        attained = _attainment(rows, knee.batch, cap.bin_rel_width)
        instances = row[c.INSTANCES] or rows[c.INSTANCE_ID].n_unique()
        knee_rps = knee.rps * instances
        out.append({**row, c.KNEE_BATCH: knee.batch, c.KNEE_BATCH_LO: knee.lo,
                    c.KNEE_BATCH_HI: knee.hi, c.KNEE_LIMIT: knee.limit,
                    c.EXTRAPOLATED: knee.extrapolated, c.KNEE_RPS: knee_rps,
                    c.GOODPUT_RPS_PER_GPU: (None if attained is None
                                            else knee.rps * attained / tp),
                    c.HEADROOM_X: knee_rps / row[c.RPS_NOW] if row[c.RPS_NOW] else None,
                    c.TPOT_SLO_S: knee.tpot_slo_s, c.TTFT_SLO_S: knee.ttft_slo_s,
                    c.TPOT_BATCH1_S: knee.tpot_batch1_s, c.STEP_BASE_S: knee.p50.base,
                    c.STEP_PER_SEQ_S: knee.p50.per_seq, c.STEP_PER_KV_TOKEN_S: knee.p50.per_kv,
                    c.FIT_R2: knee.p50.r2,
                    c.STEP_HINGE_BATCH: (knee.p50.hinge if np.isfinite(knee.p50.hinge)
                                         else None),
                    c.STEP_PER_SEQ_ABOVE_S: knee.p50.per_seq_above,
                    c.J_PER_TOKEN_KNEE: _j_per_token(rows, knee, pool, cap.bin_rel_width)})
        curve += _curve(named, knee, pool, ts_ns, cap.bin_rel_width)
    capacity_schema = t.table(t.CAPACITY).schema
    table = pl.DataFrame(out, schema=capacity_schema, strict=False)
    curve_frame = pl.DataFrame(curve, schema=t.table(t.CAPACITY_CURVE).schema, strict=False)
    windows = frame.select(list(t.table(t.CAPACITY_WINDOWS).columns))
    return CapacityTables(table.sort(POOL), curve_frame.sort([*POOL, c.BATCH]),
                          windows.sort(c.WINDOW_START_NS, c.HOST_NAME, c.INSTANCE_ID))
