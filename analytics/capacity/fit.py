"""The decode step-time curve of one pool, fitted on the windows its fleet visited.

A decode step reads the weights once and every running sequence's KV cache, so its time is
about ``base + per_seq x batch + per_kv x kv_tokens`` while memory bandwidth bounds it; past
a batch where compute (the prefill chunks that more arrivals bring, then the decode tokens
themselves) takes over, it grows faster: ``+ per_seq_above x (batch - hinge)``. That convex
two-piece line is the roofline's shape (the larger of two lines); it is fitted to each
window's TPOT percentile, weighted by the window's requests, with the hinge chosen among the
visited batches by least squares (no hinge where one line fits as well). Where batch and KV
tokens move together (one context length) the two slopes cannot be told apart: the KV term
is then dropped and ``per_seq`` carries it. Uncertainty comes from resampling the windows
(bootstrap), so a pool with few or scattered windows gets a wide knee interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: a hinge must lower the weighted squared error by this share to be kept
HINGE_GAIN = 0.05


@dataclass(frozen=True)
class Line:
    """``tpot = base + (per_seq + per_kv x context) x batch + per_seq_above x max(0,
    batch - hinge)`` and its goodness of fit (``hinge`` inf: one straight line)."""

    base: float
    per_seq: float
    per_kv: float
    r2: float
    hinge: float = float("inf")
    per_seq_above: float = 0.0

    def at(self, batch: np.ndarray | float, context: float) -> np.ndarray | float:
        """The fitted TPOT at ``batch`` running sequences of ``context`` KV tokens each."""
        above = np.maximum(np.asarray(batch, dtype=float) - self.hinge, 0.0)
        value = (self.base + (self.per_seq + self.per_kv * context) * batch
                 + self.per_seq_above * above)
        return float(value) if np.ndim(value) == 0 else value

    def batch_at(self, tpot: float, context: float) -> float:
        """The batch at which the fitted TPOT reaches ``tpot`` (inf if it never does)."""
        slope = self.per_seq + self.per_kv * context
        if np.isfinite(self.hinge) and self.at(self.hinge, context) < tpot:
            total = slope + self.per_seq_above
            return self.hinge + (tpot - self.at(self.hinge, context)) / total
        if slope <= 0:
            return float("inf")
        return max(0.0, (tpot - self.base) / slope)


def _solve(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    sw = np.sqrt(w)
    coef, _, rank, _ = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)
    return coef if rank == x.shape[1] else None


def _identifiable(batch: np.ndarray, kv: np.ndarray) -> bool:
    per_seq = kv / np.maximum(batch, 1e-9)
    return bool(np.std(per_seq) > 0.05 * max(float(np.mean(per_seq)), 1e-9))


def _candidates(batch: np.ndarray) -> list[float]:
    """Hinges to try: visited batches between the 20th and 90th percentile."""
    qs = np.unique(np.quantile(batch, np.linspace(0.2, 0.9, 15)))
    return [float(q) for q in qs if q > batch.min()]


def _fits(batch: np.ndarray, tpot: np.ndarray, weight: np.ndarray,
          base_cols: list[np.ndarray]) -> list[tuple[float, np.ndarray, float]]:
    """(weighted SSE, coefficients, hinge) of each hinge tried whose slopes are all >= 0."""
    fits = []
    for hinge in [float("inf"), *_candidates(batch)]:
        cols = list(base_cols)
        if np.isfinite(hinge):
            cols.append(np.maximum(batch - hinge, 0.0))
        x = np.column_stack(cols)
        coef = _solve(x, tpot, weight)
        if coef is not None and not np.any(coef[1:] < 0):
            fits.append((float(np.sum(weight * (x @ coef - tpot) ** 2)), coef, hinge))
    return fits


def fit_line(batch: np.ndarray, kv: np.ndarray, tpot: np.ndarray, weight: np.ndarray) -> Line:
    """Weighted least squares of ``tpot`` on batch and KV tokens, with the hinge (if any)
    that fits best; slopes are never negative (module docstring)."""
    ones = np.ones_like(batch)
    with_kv = _identifiable(batch, kv)
    fits = _fits(batch, tpot, weight, [ones, batch, kv]) if with_kv else []
    if not fits:  # the KV term not identifiable, or it came out negative: batch alone
        with_kv = False
        fits = _fits(batch, tpot, weight, [ones, batch])
    straight = [f for f in fits if not np.isfinite(f[2])]
    hinged = min((f for f in fits if np.isfinite(f[2])), key=lambda f: f[0], default=None)
    best = straight[0] if straight else hinged
    if hinged is not None and straight and hinged[0] < straight[0][0] * (1 - HINGE_GAIN):
        best = hinged
    mean = float(np.average(tpot, weights=weight))
    if best is None:  # no line with non-negative slopes: flat at the mean
        return Line(mean, 0.0, 0.0, 0.0)
    sse, coef, hinge = best
    per_kv = float(coef[2]) if with_kv else 0.0
    above = float(coef[-1]) if np.isfinite(hinge) else 0.0
    total = float(np.sum(weight * (tpot - mean) ** 2))
    r2 = 1.0 - sse / total if total > 0 else 1.0
    return Line(float(coef[0]), float(coef[1]), per_kv, r2, hinge, above)


def bootstrap(batch: np.ndarray, kv: np.ndarray, tpot: np.ndarray, weight: np.ndarray,
              samples: int, seed: int = 0) -> list[Line]:
    """``samples`` fits on windows drawn with replacement (fixed seed: the same data give
    the same interval)."""
    rng = np.random.default_rng(seed)
    n = len(batch)
    lines = []
    for _ in range(samples):
        i = rng.integers(0, n, n)
        lines.append(fit_line(batch[i], kv[i], tpot[i], weight[i]))
    return lines
