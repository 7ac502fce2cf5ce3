"""The knee of one pool: the largest batch (and arrival rate) that still meets its SLOs.

Three limits, the smallest wins (``knee_limit`` names it):

- ``tpot``: the fitted TPOT p99 (``tpot_percentile``) reaches the TPOT SLO (the service's
  own ``tpot`` latency SLO, else ``tpot_ratio`` x the fitted value at batch 1);
- ``ttft``: the first batch bin whose windows' median TTFT p99 breaks the TTFT SLO (the
  service's own ``ttft`` SLO, else ``ttft_p99_s``): queueing shows there, not in TPOT. The
  TTFT p99 of a window is of the requests that arrived in it (the load they queued at);
  a window nothing arrived in (a queue draining) says nothing about it;
- ``kv``: the KV cache holds no more sequences of the pool's mean context.

The arrival rate at a batch follows from Little's law on the running requests: a request
runs for its prefill plus (output tokens - 1) x TPOT, so one instance takes
``rps = batch / (prefill_s + (output - 1) x tpot_p50(batch))``.

The TPOT curve is fitted on the windows whose load was steady (:func:`.points.steady`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fleetlens.analytics.capacity.config import CapacityConfig
from fleetlens.analytics.capacity.fit import Line, bootstrap, fit_line
from fleetlens.analytics.slos.config import SloConfig

TPOT, TTFT, KV, NONE = "tpot", "ttft", "kv", "none"
#: The TPOT curve is fitted on at most this many windows (a fixed random sample beyond):
#: a fit costs about 2 us per window and the interval takes 100 of them, so two days of 32
#: instances (92k windows) would take seconds per pool; 2,000 windows pin a two-piece line
#: (the interval is then that of 2,000 windows: wider, never narrower).
MAX_FIT_WINDOWS = 2000


@dataclass(frozen=True)
class Pool:
    """One pool's windows as arrays (one entry per instance-window) and its means."""

    batch: np.ndarray
    kv: np.ndarray
    tpot_p50: np.ndarray
    tpot_p99: np.ndarray
    ttft_p99: np.ndarray  # of the requests that arrived in the window; nan: none arrived
    requests: np.ndarray
    steady: np.ndarray  # bool: the window's load was steady (:func:`.points.steady`)
    context: float  # mean KV tokens per running sequence
    output: float  # mean output tokens per request
    prefill_s: float  # mean prefill time per request
    kv_capacity: float | None  # KV tokens an instance holds, if reported


@dataclass(frozen=True)
class Knee:
    """Where a pool's SLOs break, with the fits it came from (``lines``: bootstrap fits of
    the judged percentile)."""

    batch: float
    lo: float
    hi: float
    limit: str
    extrapolated: bool
    rps: float  # per instance
    tpot_slo_s: float
    ttft_slo_s: float
    tpot_batch1_s: float
    p50: Line
    p99: Line
    lines: list[Line]


def slo_thresholds(service: str, slos: SloConfig, config: CapacityConfig
                   ) -> tuple[float | None, float]:
    """(TPOT threshold or None for the batch-1 rule, TTFT threshold) of ``service``."""
    tpot, ttft = None, config.ttft_p99_s
    for entry in slos.services:
        if entry.service == service:
            for slo in entry.latency:
                if slo.metric == "tpot":
                    tpot = slo.threshold_s
                elif slo.metric == "ttft":
                    ttft = slo.threshold_s
    return tpot, ttft


def rps_at(batch: float | np.ndarray, p50: Line, pool: Pool) -> float | np.ndarray:
    """One instance's arrival rate at ``batch`` (Little's law on the running requests)."""
    running_s = pool.prefill_s + max(pool.output - 1.0, 0.0) * p50.at(batch, pool.context)
    return batch / running_s


def _bins(batch: np.ndarray, rel: float) -> np.ndarray:
    """Bin index of each batch on a geometric grid of ratio (1 + rel) / (1 - rel) centred on
    the largest batch (bin 0): windows at an engine's seat limit, whose batches differ by a
    few percent, share one bin wherever the limit lies (on a grid from batch 1 the edge at
    7.72 split a real vLLM's 8-seat windows, 7.6 from 7.8 and 8.0)."""
    ratio = (1 + rel) / (1 - rel)
    top = max(float(batch.max()), 0.5) if batch.size else 1.0
    return np.floor(np.log(np.maximum(batch, 0.5) / top) / math.log(ratio) + 0.5).astype(int)


def ttft_limit(pool: Pool, bound: float, rel: float) -> float:
    """The largest batch visited before the first bin whose median TTFT p99 breaks the
    bound, or inside that bin the largest at which a window met it, no larger than the
    bin's largest break; where no bin breaks it but a window of the top bin did, the top
    bin's largest batch that met it (inf when no window breaks it there). Windows without
    arrivals (nan) are left out.

    The bins are wide (+-25%): a real vLLM's near-capacity window (batch 5.2, TTFT p99
    0.15 s) shared one with two of the overload's (7.6 and 7.7, 2.5 and 3.1 s), and the knee
    came out at the batch below the bin, 3.8, where the sweep's was 8. Inside the bin the
    batch does not order the breaks: at a seat limit every window runs the same batch and
    the overload's queue, not the batch, breaks TTFT (near capacity 7.80 met it, the
    overload's 7.80 and 8.0 broke it). A break in the top bin caps the knee even where most
    of the bin's windows met the SLO: the batch went no further, and requests that came
    faster waited (TTFT p99 2.9 s at 7.6 beside 0.24 and 1.72 s at 7.8 and 8.0)."""
    judged = np.isfinite(pool.ttft_p99)
    batch, ttft = pool.batch[judged], pool.ttft_p99[judged]
    if not batch.size:
        return float("inf")
    bins = _bins(batch, rel)
    for b in sorted(set(bins.tolist())):
        inside = bins == b
        if np.median(ttft[inside]) > bound:
            last = batch[inside & (ttft > bound)].max()
            met = batch[(bins < b) | (inside & (batch <= last) & (ttft <= bound))]
            return float(met.max()) if met.size else float(batch[inside].min())
    top = bins == bins.max()
    if (ttft[top] > bound).any():
        return float(batch[top & (ttft <= bound)].max())
    return float("inf")


def _subset(pool: Pool, keep: np.ndarray) -> Pool:
    return replace(pool, batch=pool.batch[keep], kv=pool.kv[keep],
                   tpot_p50=pool.tpot_p50[keep], tpot_p99=pool.tpot_p99[keep],
                   ttft_p99=pool.ttft_p99[keep], requests=pool.requests[keep],
                   steady=pool.steady[keep])


def steady(pool: Pool, config: CapacityConfig) -> Pool:
    """The pool's steady windows; all of them where fewer than ``min_windows`` are."""
    keep = pool.steady
    if keep.all() or keep.sum() < config.min_windows:
        return pool
    return _subset(pool, keep)


def _sampled(pool: Pool) -> Pool:
    """At most :data:`MAX_FIT_WINDOWS` of the pool's windows (seeded: the same data give
    the same sample)."""
    n = pool.batch.size
    if n <= MAX_FIT_WINDOWS:
        return pool
    keep = np.sort(np.random.default_rng(0).choice(n, MAX_FIT_WINDOWS, replace=False))
    return _subset(pool, keep)


def _local(pool: Pool, tpot_slo: float | None, config: CapacityConfig) -> Pool:
    """The windows that decide the knee: at most twice the knee's batch, refitted until the
    range settles (three rounds at most). Windows far past the knee (a saturated engine,
    its batch held at ``max_num_seqs``) do not bend the line where the SLO is crossed."""
    local = pool
    for _ in range(3):
        line = fit_line(local.batch, local.kv, _judged(local, config),
                        local.requests.astype(float))
        one = batch1_measured(pool, config)
        slo = tpot_slo if tpot_slo is not None else config.tpot_ratio * (
            one if one is not None else line.at(1.0, local.context))
        keep = pool.batch <= 2.0 * line.batch_at(slo, local.context)
        if keep.sum() < config.min_windows or keep.sum() == local.batch.size:
            break
        local = _subset(pool, keep)
    return local


def batch1_measured(pool: Pool, config: CapacityConfig) -> float | None:
    """The judged TPOT percentile at batch 1 as measured: the request-weighted median over
    the windows whose batch was 0.5-1.5 (at least 4 of them, 100 requests), else None (the
    fit's value is used: the p99 of two windows is noise).
    A line through the whole range misses the flat start of the curve by a few percent,
    which moves the knee by ten or more (a random simulated fleet: +18%)."""
    near = np.abs(pool.batch - 1.0) <= 0.5
    if near.sum() < 4 or pool.requests[near].sum() < 100:
        return None
    values, weights = _judged(pool, config)[near], pool.requests[near].astype(float)
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def _judged(pool: Pool, config: CapacityConfig) -> np.ndarray:
    return pool.tpot_p50 if config.tpot_percentile == "p50" else pool.tpot_p99


def find_knee(whole: Pool, tpot_slo: float | None, ttft_slo: float,
              config: CapacityConfig) -> Knee:
    """The knee of ``whole`` (module docstring); ``tpot_slo`` None: the batch-1 rule. The
    TPOT curve is fitted on the steady windows (:func:`steady`) around the knee
    (:func:`_local`); the TTFT and KV limits look at every window."""
    pool = _local(_sampled(steady(whole, config)), tpot_slo, config)
    w = pool.requests.astype(float)
    p50 = fit_line(pool.batch, pool.kv, pool.tpot_p50, w)
    p99 = fit_line(pool.batch, pool.kv, pool.tpot_p99, w)
    judged, judged_y = (p50, pool.tpot_p50) if config.tpot_percentile == "p50" else (
        p99, pool.tpot_p99)
    lines = bootstrap(pool.batch, pool.kv, judged_y, w, config.bootstrap_samples)
    measured = batch1_measured(whole, config)
    batch1 = measured if measured is not None else float(judged.at(1.0, pool.context))

    def tpot_batch(line: Line) -> float:
        one = measured if measured is not None else line.at(1.0, pool.context)
        slo = tpot_slo if tpot_slo is not None else config.tpot_ratio * one
        return line.batch_at(slo, pool.context)

    limits = {TPOT: tpot_batch(judged), TTFT: ttft_limit(whole, ttft_slo, config.bin_rel_width),
              KV: (pool.kv_capacity / pool.context if pool.kv_capacity and pool.context > 0
                   else float("inf"))}
    limit = min(limits, key=lambda k: limits[k])
    batch = limits[limit]
    if math.isinf(batch):
        limit, batch = NONE, float(whole.batch.max())
    others = min(limits[TTFT], limits[KV])
    spread = np.array([min(tpot_batch(line), others) for line in lines])
    spread = spread[np.isfinite(spread)]
    lo, hi = ((float(np.percentile(spread, 5)), float(np.percentile(spread, 95)))
              if spread.size else (batch, batch))
    visited = float(whole.batch.max()) * (1 + config.bin_rel_width)
    return Knee(batch=batch, lo=min(lo, batch), hi=max(hi, batch), limit=limit,
                extrapolated=batch > visited, rps=float(rps_at(batch, p50, pool)),
                tpot_slo_s=tpot_slo if tpot_slo is not None else config.tpot_ratio * batch1,
                ttft_slo_s=ttft_slo, tpot_batch1_s=batch1, p50=p50, p99=p99, lines=lines)
