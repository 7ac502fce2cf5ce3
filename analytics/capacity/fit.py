"""The decode step-time curve of one pool, fitted on the windows its fleet visited.

A decode step reads the weights once and every running sequence's KV cache, so its time is
about ``base + per_seq x batch + per_kv_token x kv_tokens`` until compute or a limit takes
over (the roofline). TPOT (decode time per output token) is that step time, so the model is
fitted to each window's TPOT percentile, weighted by the window's requests. Where batch and
KV tokens move together (one context length) the two slopes cannot be told apart: the KV
term is then dropped and ``per_seq`` carries it. Uncertainty comes from resampling the
windows (bootstrap), so a pool with few or scattered windows gets a wide knee interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Line:
    """``tpot = base + per_seq x batch + per_kv x kv_tokens`` and its goodness of fit."""

    base: float
    per_seq: float
    per_kv: float
    r2: float

    def at(self, batch: np.ndarray | float, context: float) -> np.ndarray | float:
        """The fitted TPOT at ``batch`` running sequences of ``context`` KV tokens each."""
        return self.base + (self.per_seq + self.per_kv * context) * batch

    def batch_at(self, tpot: float, context: float) -> float:
        """The batch at which the fitted TPOT reaches ``tpot`` (inf if it never does)."""
        slope = self.per_seq + self.per_kv * context
        if slope <= 0:
            return float("inf")
        return max(0.0, (tpot - self.base) / slope)


def _solve(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    sw = np.sqrt(w)
    coef, _, rank, _ = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)
    return coef if rank == x.shape[1] else None


def fit_line(batch: np.ndarray, kv: np.ndarray, tpot: np.ndarray, weight: np.ndarray) -> Line:
    """Weighted least squares of ``tpot`` on batch and KV tokens (the KV term kept only when
    it is identifiable and not negative; slopes never negative)."""
    ones = np.ones_like(batch)
    coef = None
    if np.std(kv / np.maximum(batch, 1e-9)) > 0.05 * max(np.mean(kv / np.maximum(batch, 1e-9)),
                                                         1e-9):
        coef = _solve(np.column_stack([ones, batch, kv]), tpot, weight)
        if coef is not None and (coef[2] < 0 or coef[1] < 0):
            coef = None
    if coef is None:
        two = _solve(np.column_stack([ones, batch]), tpot, weight)
        coef = np.array([np.average(tpot, weights=weight), 0.0, 0.0]) if two is None else (
            np.array([two[0], max(two[1], 0.0), 0.0]))
        if two is not None and two[1] < 0:  # flat: the mean, no slope
            coef = np.array([np.average(tpot, weights=weight), 0.0, 0.0])
    pred = coef[0] + coef[1] * batch + coef[2] * kv
    mean = np.average(tpot, weights=weight)
    total = np.sum(weight * (tpot - mean) ** 2)
    r2 = 1.0 - np.sum(weight * (tpot - pred) ** 2) / total if total > 0 else 1.0
    return Line(float(coef[0]), float(coef[1]), float(coef[2]), float(r2))


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
