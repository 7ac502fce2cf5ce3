"""Leaderboard: which (model, GPU model, config) serves best.

Per configuration: TTFT/TPOT/e2e p50 and p99, output tokens/s per GPU, J/token and the
estimated memory-bandwidth utilisation. Then the Pareto front, a weighted score (configurable
weights over min-max normalised metrics) and an entropy-weighted score (metrics that
discriminate more weigh more), ranks with bootstrap 95% confidence intervals, and the best
configuration under an SLA by J/token. Like is compared with like: with ``by_bucket`` each
prompt-length bucket is ranked on its own.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from fleetlens.analytics.attribution.dimensions import add_buckets
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.energy import energy_key
from fleetlens.analytics.hardware import hbm_gbps, model_shape
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
KEY = [c.MODEL, c.GPU_MODEL, c.CONFIG]
#: metric -> True when higher is better.
OBJECTIVES = {c.percentile_column("ttft", "p99"): False,
              c.percentile_column("tpot", "p99"): False,
              c.percentile_column("e2e", "p99"): False,
              c.TOK_S_PER_GPU: True, c.J_PER_TOKEN: False}
_PCT = {"ttft": c.TTFT_S, "tpot": c.TPOT_S, "e2e": c.E2E_S}


def prepare(requests: pl.DataFrame, instance_gpus: pl.DataFrame, gpu_samples: pl.DataFrame,
            request_energy: pl.DataFrame | None = None) -> pl.DataFrame:
    """Requests with ``gpu_model``, ``config`` (``tp=N``), GPU count and energy attached."""
    mapping = instance_gpus.filter(pl.col(c.GPU_UUID).is_not_null() & (pl.col(c.GPU_UUID) != ""))
    tp = mapping.group_by(c.INSTANCE_ID).agg(pl.col(c.GPU_UUID).n_unique().alias("_gpus"))
    frame = requests.join(tp, on=c.INSTANCE_ID, how="left").with_columns(
        pl.col("_gpus").fill_null(1))
    frame = frame.with_columns(pl.concat_str(pl.lit("tp="), pl.col("_gpus").cast(pl.String))
                               .alias(c.CONFIG))
    if c.GPU_MODEL not in frame.columns or frame[c.GPU_MODEL].is_null().all():
        hosts = gpu_samples.group_by(c.HOST_NAME).agg(pl.col(c.GPU_MODEL).first())
        frame = frame.drop(c.GPU_MODEL, strict=False).join(hosts, on=c.HOST_NAME, how="left")
    if request_energy is not None and request_energy.height:
        key = energy_key(frame, request_energy)
        frame = frame.join(request_energy.select(*key, c.ENERGY_J), on=key, how="left")
    else:
        frame = frame.with_columns(pl.lit(None, pl.Float64).alias(c.ENERGY_J))
    return add_buckets(frame.with_columns(pl.col(c.GPU_MODEL).fill_null("unknown")))


def _metrics(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    aggs = [pl.len().alias(c.REQUESTS)]
    for name, column in _PCT.items():
        for suffix, q in (("p50", 0.5), ("p99", 0.99)):
            aggs.append(pl.col(column).quantile(q, "linear")
                        .alias(c.percentile_column(name, suffix)))
    span_s = ((pl.col(c.END_NS).max() - pl.col(c.ARRIVAL_NS).min()) / NS).clip(lower_bound=1)
    gpus = (pl.col(c.INSTANCE_ID).n_unique() * pl.col("_gpus").mean())
    aggs += [
        pl.col(c.OUTPUT_TOKENS).sum().alias(c.OUTPUT_TOKENS),
        (pl.col(c.OUTPUT_TOKENS).sum() / span_s / gpus).alias(c.TOK_S_PER_GPU),
        (pl.col(c.ENERGY_J).sum() / pl.col(c.OUTPUT_TOKENS).sum().clip(lower_bound=1))
        .alias(c.J_PER_TOKEN),
        pl.col(c.ENERGY_J).is_not_null().any().alias("_has_energy"),
        (pl.col(c.INPUT_TOKENS) + pl.col(c.OUTPUT_TOKENS) / 2).mean().alias("_ctx"),
        pl.col("_gpus").mean().alias("_tp"),
        pl.col(c.TPOT_S).median().alias("_tpot_med"),
    ]
    out = frame.group_by(keys).agg(aggs)
    return out.with_columns(pl.when(pl.col("_has_energy")).then(pl.col(c.J_PER_TOKEN))
                            .alias(c.J_PER_TOKEN)).drop("_has_energy")


def bandwidth_util(rows: pl.DataFrame, config: AnalyticsConfig) -> list[float | None]:
    """Estimated HBM utilisation while decoding: each step reads the weights (shared by the
    batch) and every sequence's KV; per GPU, tokens/s x bytes per token / (tp x HBM GB/s).
    The batch is estimated as (time per token) x (tokens/s per instance)."""
    out = []
    for row in rows.iter_rows(named=True):
        shape = model_shape(row[c.MODEL] or "", config)
        bw = hbm_gbps(row[c.GPU_MODEL] or "", config)
        if not shape or not bw or not row["_tpot_med"] or row[c.TOK_S_PER_GPU] is None:
            out.append(None)
            continue
        tp = row["_tp"] or 1
        tok_s_instance = row[c.TOK_S_PER_GPU] * tp
        batch = max(1.0, tok_s_instance * row["_tpot_med"])
        per_token = shape.weight_bytes / batch + row["_ctx"] * shape.kv_bytes_per_token
        out.append(min(1.0, tok_s_instance * per_token / tp / (bw * 1e9)))
    return out


def _normalise(frame: pl.DataFrame, metrics: list[str]) -> np.ndarray:
    cols = []
    for m in metrics:
        x = frame[m].cast(pl.Float64).fill_null(strategy="mean").to_numpy()
        lo, hi = np.nanmin(x), np.nanmax(x)
        span = hi - lo
        n = np.ones_like(x) if not span or math.isnan(span) else (
            (x - lo) / span if OBJECTIVES[m] else (hi - x) / span)
        cols.append(n)
    return np.column_stack(cols) if cols else np.zeros((frame.height, 0))


def entropy_weights(norm: np.ndarray) -> np.ndarray:
    """Entropy weight method: metrics whose values differ more across rows weigh more."""
    m = norm.shape[0]
    if m < 2 or norm.shape[1] == 0:
        return np.full(norm.shape[1], 1 / max(norm.shape[1], 1))
    p = (norm + 1e-12) / (norm + 1e-12).sum(axis=0)
    e = -(p * np.log(p)).sum(axis=0) / math.log(m)
    d = 1 - e
    return d / d.sum() if d.sum() > 0 else np.full(norm.shape[1], 1 / norm.shape[1])


def pareto(frame: pl.DataFrame, metrics: list[str]) -> list[bool]:
    """True for rows no other row beats on every metric (and strictly on one)."""
    signs = np.array([1.0 if OBJECTIVES[m] else -1.0 for m in metrics])
    x = frame.select(metrics).fill_null(strategy="mean").to_numpy() * signs
    front = []
    for i in range(len(x)):
        dominated = np.any(np.all(x >= x[i], axis=1) & np.any(x > x[i], axis=1))
        front.append(not dominated)
    return front


def _scored(frame: pl.DataFrame, config: AnalyticsConfig) -> pl.DataFrame:
    metrics = [m for m in OBJECTIVES if m in frame.columns and frame[m].is_not_null().any()]
    norm = _normalise(frame, metrics)
    weights = np.array([config.leaderboard_weights.get(m, 0.0) for m in metrics])
    weighted = norm @ weights / weights.sum() if weights.sum() > 0 else norm.mean(axis=1)
    ent = norm @ entropy_weights(norm)
    return frame.with_columns(
        pl.Series(c.WEIGHTED_SCORE, weighted), pl.Series(c.ENTROPY_SCORE, ent),
        pl.Series(c.PARETO, pareto(frame, metrics)),
    )


def at_the_knee(board: pl.DataFrame, capacity: pl.DataFrame | None) -> pl.DataFrame:
    """``board`` (with ``_tp``) plus goodput per GPU and J/token at the knee from the stored
    `capacity` table, joined on the pool keys the leaderboard has (model, GPU model, TP);
    where several pools (services, configuration fingerprints) share them, their
    instance-weighted mean. Null where no pool has a knee: never guessed."""
    empty = board.with_columns(pl.lit(None, pl.Float64).alias(c.GOODPUT_RPS_PER_GPU),
                               pl.lit(None, pl.Float64).alias(c.J_PER_TOKEN_KNEE))
    if capacity is None or capacity.is_empty():
        return empty
    # a table stored before a column existed reads without it
    capacity = capacity.with_columns(pl.lit(None, pl.Float64).alias(col) for col in (
        c.GOODPUT_RPS_PER_GPU, c.J_PER_TOKEN_KNEE, c.INSTANCES) if col not in capacity.columns)

    def weighted(col: str) -> pl.Expr:
        ok = pl.col(col).is_not_null()
        w = pl.col(c.INSTANCES).fill_null(1).clip(lower_bound=1).cast(pl.Float64)
        total = w.filter(ok).sum()
        return pl.when(total > 0).then((pl.col(col) * w).filter(ok).sum() / total).alias(col)

    pools = (capacity.filter(pl.col(c.KNEE_BATCH).is_not_null())
             .group_by(c.MODEL, c.GPU_MODEL, c.TP)
             .agg(weighted(c.GOODPUT_RPS_PER_GPU), weighted(c.J_PER_TOKEN_KNEE))
             .with_columns(pl.col(c.TP).cast(pl.Float64).alias("_tp")).drop(c.TP))
    return board.join(pools, on=[c.MODEL, c.GPU_MODEL, "_tp"], how="left")


def leaderboard(prepared: pl.DataFrame, config: AnalyticsConfig | None = None, *,
                by_bucket: bool = False, seed: int = 0,
                capacity: pl.DataFrame | None = None) -> pl.DataFrame:
    """Stage: prepared requests -> one row per configuration (per prompt bucket).

    Ranks (1 = best weighted score) come with a bootstrap 95% interval (``rank_lo``,
    ``rank_hi``) from ``config.bootstrap_samples`` resamples of each configuration's requests.
    With the stored `capacity` table, each row also carries its pools' goodput per GPU and
    J/token at the knee (:func:`at_the_knee`; shown, not scored: they describe the pool at
    its limit, the other columns the requests served).
    """
    config = config or AnalyticsConfig()
    keys = [*KEY, c.PROMPT_BUCKET] if by_bucket else list(KEY)
    # Sorted: group_by's order varies run to run, and the bootstrap draws its resamples
    # configuration by configuration in this order (otherwise the same data gave other CIs).
    base = _metrics(prepared, keys).sort(keys, nulls_last=True)
    if base.is_empty():
        return base
    base = at_the_knee(base.with_columns(pl.Series(c.MEM_BW_UTIL, bandwidth_util(base, config),
                                                   dtype=pl.Float64)), capacity)
    parts = []
    groups = base.group_by(c.PROMPT_BUCKET) if by_bucket else [((None,), base)]
    for _, rows in groups:
        scored = _scored(rows, config)
        scored = scored.with_columns(pl.col(c.WEIGHTED_SCORE).rank("ordinal", descending=True)
                                     .cast(pl.Int64).alias(c.RANK))
        lo, hi = _bootstrap(prepared, scored, keys, config, seed)
        parts.append(scored.with_columns(pl.Series(c.RANK_LO, lo), pl.Series(c.RANK_HI, hi)))
    out = pl.concat(parts).sort([*([c.PROMPT_BUCKET] if by_bucket else []), c.RANK])
    return out.drop([col for col in out.columns if col.startswith("_")])


def _bootstrap(prepared: pl.DataFrame, scored: pl.DataFrame, keys: list[str],
               config: AnalyticsConfig, seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    rows = scored.select(keys).to_dicts()
    samples = []
    for row in rows:
        mask = pl.all_horizontal([pl.col(k) == v for k, v in row.items()])
        # Resampled by position: a fixed order makes the intervals independent of the order
        # the rows were read in (a DuckDB scan and a Polars scan order them differently).
        order = [k for k in (c.ARRIVAL_NS, c.TRACE_ID, c.SPAN_ID, c.REQUEST_ID)
                 if k in prepared.columns]
        part = prepared.filter(mask).sort(order) if order else prepared.filter(mask)
        if part.height > 20000:
            part = part.sample(20000, seed=seed)
        samples.append(part)
    ranks = np.zeros((config.bootstrap_samples, len(rows)), dtype=np.int64)
    for b in range(config.bootstrap_samples):
        drawn = [s[rng.integers(0, s.height, s.height)] if s.height else s for s in samples]
        metrics = pl.concat([_metrics(d, keys) for d in drawn if d.height])
        if metrics.height != len(rows):
            ranks[b] = np.arange(1, len(rows) + 1)
            continue
        metrics = metrics.join(scored.select(*keys, c.TOK_S_PER_GPU).rename(
            {c.TOK_S_PER_GPU: "_tok"}), on=keys).with_columns(
            pl.col("_tok").alias(c.TOK_S_PER_GPU))  # throughput is not resampled noise
        order = {tuple(r[k] for k in keys): i for i, r in enumerate(rows)}
        score = _scored(metrics, config)[c.WEIGHTED_SCORE].to_numpy()
        idx = [order[tuple(r[k] for k in keys)] for r in metrics.select(keys).to_dicts()]
        ordered = np.empty(len(rows))
        ordered[idx] = score
        ranks[b] = (-ordered).argsort().argsort() + 1
    lo = np.percentile(ranks, 2.5, axis=0).round().astype(int).tolist()
    hi = np.percentile(ranks, 97.5, axis=0).round().astype(int).tolist()
    return lo, hi


def best_under_sla(board: pl.DataFrame, sla: dict[str, float]) -> dict | None:
    """The configuration meeting every ``column <= limit`` of ``sla`` with the lowest
    J/token (highest tokens/s per GPU when energy is unknown); ``None`` if none meets it."""
    ok = board
    for column, limit in sla.items():
        if column not in board.columns:
            raise ValueError(f"SLA names {column!r}, not a leaderboard column")
        ok = ok.filter(pl.col(column) <= limit)
    if ok.is_empty():
        return None
    if ok[c.J_PER_TOKEN].is_not_null().any():
        return ok.sort(c.J_PER_TOKEN, nulls_last=True).row(0, named=True)
    return ok.sort(c.TOK_S_PER_GPU, descending=True).row(0, named=True)


def outside_incidents(requests: pl.DataFrame, incidents: pl.DataFrame) -> pl.DataFrame:
    """``requests`` minus those that arrived during an incident of their own scope.

    An incident covers ``[start_ns, end_ns)`` of its service, model and host (``*`` matches
    all). A leaderboard ranks configurations on steady service: a KV-pressure spike on one
    host would otherwise decide its configuration's p99.
    """
    if requests.is_empty() or incidents.is_empty():
        return requests
    inside = pl.lit(False)
    for inc in incidents.iter_rows(named=True):
        hit = pl.col(c.ARRIVAL_NS).is_between(inc[c.START_NS], inc[c.END_NS] or inc[c.START_NS],
                                              closed="left")
        for key in (c.SERVICE_NAME, c.MODEL, c.HOST_NAME):
            if inc.get(key) not in (None, "", FLEET_WIDE):
                hit = hit & (pl.col(key) == inc[key])
        inside = inside | hit
    return requests.filter(~inside)
