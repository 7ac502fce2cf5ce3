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

Each term must earn its place (issue 31: nine windows of a real vLLM at batches 1-3, whose
TPOT scattered 10-20%, gave a slope 2-3.5x too steep and once a hinge at batch 1.2): the
straight line's slope is kept only where an F-test (the slope's t statistic) tells it from
none at :data:`ALPHA`, else the step time is flat at the weighted mean (the least-assuming
model; the knee is then not from TPOT); a hinge only where the error it removes is
significant at :data:`ALPHA` over the hinges tried (Bonferroni), besides :data:`HINGE_GAIN`.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

#: a hinge must lower the weighted squared error by this share to be kept
HINGE_GAIN = 0.05
#: the significance level a slope or hinge must reach (two-sided, the usual 5%)
ALPHA = 0.05


def t_critical(alpha: float, dof: int) -> float:
    """Student's t two-sided critical value at ``alpha`` with ``dof`` degrees of freedom
    (Cornish-Fisher expansion around the normal quantile: within 1% from 3 dof)."""
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    v = float(dof)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))


def _significant(sse_without: float, sse_with: float, n: int, params: int, extra: int,
                 alpha: float) -> bool:
    """Whether ``extra`` (1 or 2) more terms, ``params`` in all, lower the error
    significantly: the F statistic against its critical value at ``alpha`` (1 numerator
    dof: t squared; 2: the closed form ``dof / 2 x (alpha^(-2/dof) - 1)``)."""
    dof = n - params
    if dof < 1 or sse_without <= sse_with:
        return False
    if sse_with <= 0:
        return True
    f = (sse_without - sse_with) / extra / (sse_with / dof)
    crit = (t_critical(alpha, dof) ** 2 if extra == 1
            else dof / 2.0 * (alpha ** (-2.0 / dof) - 1.0))
    return f > crit


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
    hinges = [f for f in fits if np.isfinite(f[2])]
    hinged = min(hinges, key=lambda f: f[0], default=None)
    mean = float(np.average(tpot, weights=weight))
    total = float(np.sum(weight * (tpot - mean) ** 2))
    best = straight[0] if straight else None
    # the straight line's slopes (batch, and KV tokens where identifiable) against none
    if best is not None and not _significant(total, best[0], len(batch), len(best[1]),
                                             len(best[1]) - 1, ALPHA):
        best = None
    reference = best[0] if best is not None else total
    if hinged is not None and hinged[0] < reference * (1 - HINGE_GAIN) and _significant(
            reference, hinged[0], len(batch), len(hinged[1]),
            len(hinged[1]) - (len(best[1]) if best is not None else 1),
            ALPHA / max(len(hinges), 1)):
        best = hinged
    if best is None:  # no slope told from none: flat at the mean
        return Line(mean, 0.0, 0.0, 0.0)
    sse, coef, hinge = best
    per_kv = float(coef[2]) if with_kv else 0.0
    above = float(coef[-1]) if np.isfinite(hinge) else 0.0
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
