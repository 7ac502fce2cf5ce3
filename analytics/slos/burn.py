"""Error budgets, burn rates and multiwindow, multi-burn-rate alerts from per-window events.

For an SLO with objective ``o`` the error budget is the share ``1 - o`` of events allowed to
be bad. Over a window, the *burn rate* is ``error ratio / (1 - o)``: 1 spends the budget
exactly over the compliance period, 14.4 spends 2% of a 30-day budget in an hour. An alert
fires when the burn rate is at least its factor over *both* its long and short window,
ending now (the SRE workbook's "multiwindow, multi-burn-rate alerts"); a window without
events burns nothing.

Windows are whole pipeline windows: an alert window of ``w`` seconds sums the
``ceil(w / window_s)`` windows ending now.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import polars as pl

from fleetlens.analytics.slos.config import BurnRateAlert, SloConfig
from fleetlens.analytics.slos.events import Sli, slis
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000


def _dense(events: pl.DataFrame, sli: Sli, window_s: int, start_ns: int, now_ns: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (events, bad) over every window in [start_ns, now_ns), zero-filled, with a
    leading 0 so that ``cum[i] - cum[i - k]`` sums the k windows ending at window i."""
    step = window_s * NS
    n = max(0, (now_ns - start_ns) // step)
    total, bad = np.zeros(n, np.int64), np.zeros(n, np.int64)
    mine = events.filter((pl.col(c.SERVICE_NAME) == sli.service) & (pl.col(c.SLO) == sli.name)
                         & (pl.col(c.WINDOW_START_NS) >= start_ns)
                         & (pl.col(c.WINDOW_START_NS) < now_ns))
    index = ((mine[c.WINDOW_START_NS].to_numpy() - start_ns) // step).astype(np.int64)
    np.add.at(total, index, mine[c.TOTAL_EVENTS].to_numpy())
    np.add.at(bad, index, mine[c.BAD_EVENTS].to_numpy())
    zero = np.zeros(1, np.int64)
    return np.concatenate([zero, np.cumsum(total)]), np.concatenate([zero, np.cumsum(bad)])


def _trailing(cum: np.ndarray, windows: int) -> np.ndarray:
    """Sums of the ``windows`` windows ending at each window (fewer at the start)."""
    shifted = np.concatenate([np.zeros(windows, cum.dtype), cum[:-windows]])[:len(cum)]
    return (cum - shifted)[1:]


def _burn(total: np.ndarray, bad: np.ndarray, budget: float) -> np.ndarray:
    """Burn rates, NaN where a window had no events."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, bad / np.maximum(total, 1) / budget, np.nan)


def evaluate(events: pl.DataFrame, config: SloConfig, window_s: int, now_ns: int
             ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The `slo_status`, `slo_burn_rates` and `slo_alerts` rows of every SLO at ``now_ns``.

    Args:
        events: `slo_windows` rows (:func:`analytics.slos.events.window_events`).
        config: the SLOs and alert rules.
        window_s: the size of the event windows, s.
        now_ns: the end of the evaluation (a window edge).
    """
    start_ns = now_ns - math.ceil(config.period_s / window_s) * window_s * NS
    status, rates, alerts = [], [], []
    for sli in slis(config):
        cum_total, cum_bad = _dense(events, sli, window_s, start_ns, now_ns)
        status.append(_status(sli, int(cum_total[-1]), int(cum_bad[-1]), config, now_ns))
        for w in config.windows_s():
            k = math.ceil(w / window_s)
            total = int(cum_total[-1] - cum_total[max(0, len(cum_total) - 1 - k)])
            bad = int(cum_bad[-1] - cum_bad[max(0, len(cum_bad) - 1 - k)])
            ratio = bad / total if total else None
            rates.append({c.TS_NS: now_ns, c.SERVICE_NAME: sli.service, c.SLO: sli.name,
                          c.WINDOW_S: w, c.TOTAL_EVENTS: total, c.BAD_EVENTS: bad,
                          c.ERROR_RATIO: ratio,
                          c.BURN_RATE: None if ratio is None else ratio / sli.budget})
        for rule in config.alerts:
            row = _alert(sli, rule, cum_total, cum_bad, window_s, start_ns, now_ns)
            if row is not None:
                alerts.append(row)
    return (_frame(t.SLO_STATUS, status), _frame(t.SLO_BURN_RATES, rates),
            _frame(t.SLO_ALERTS, alerts))


def _status(sli: Sli, total: int, bad: int, config: SloConfig, now_ns: int) -> dict:
    allowed = sli.budget * total
    consumed = bad / allowed if allowed > 0 else (0.0 if bad == 0 else math.inf)
    return {
        c.TS_NS: now_ns, c.SERVICE_NAME: sli.service, c.SLO: sli.name, c.SLO_KIND: sli.kind,
        c.METRIC: sli.metric, c.THRESHOLD_S: sli.threshold_s, c.OBJECTIVE: sli.objective,
        c.PERIOD_S: config.period_s, c.TOTAL_EVENTS: total, c.BAD_EVENTS: bad,
        c.COMPLIANCE: 1 - bad / total if total else None, c.ALLOWED_BAD_EVENTS: allowed,
        c.BUDGET_REMAINING: min(1.0, max(0.0, 1.0 - consumed)), c.BUDGET_CONSUMED: consumed,
    }


def _alert(sli: Sli, rule: BurnRateAlert, cum_total: np.ndarray, cum_bad: np.ndarray,
           window_s: int, start_ns: int, now_ns: int) -> dict | None:
    """The alert's row when it fires at ``now_ns``; ``since_ns`` is the end of the first
    window of the run of windows, ending now, at which both burn rates were above the
    factor (stable from run to run, so the alert's id is)."""
    burns = []
    for w in (rule.long_window_s, rule.short_window_s):
        k = math.ceil(w / window_s)
        burns.append(_burn(_trailing(cum_total, k), _trailing(cum_bad, k), sli.budget))
    with np.errstate(invalid="ignore"):
        firing = (burns[0] >= rule.factor) & (burns[1] >= rule.factor)
    if not len(firing) or not firing[-1]:
        return None
    off = np.flatnonzero(~firing)
    first = int(off[-1]) + 1 if len(off) else 0
    since_ns = start_ns + (first + 1) * window_s * NS
    key = f"{sli.service}\n{sli.name}\n{rule.name()}\n{since_ns}"
    return {
        c.TS_NS: now_ns, c.ALERT_ID: hashlib.sha256(key.encode()).hexdigest()[:16],
        c.SERVICE_NAME: sli.service, c.SLO: sli.name, c.ALERT: rule.name(),
        c.SEVERITY: rule.severity, c.FACTOR: rule.factor, c.LONG_WINDOW_S: rule.long_window_s,
        c.SHORT_WINDOW_S: rule.short_window_s, c.LONG_BURN_RATE: float(burns[0][-1]),
        c.SHORT_BURN_RATE: float(burns[1][-1]), c.OBJECTIVE: sli.objective,
        c.SINCE_NS: since_ns,
    }


def _frame(table: str, rows: list[dict]) -> pl.DataFrame:
    empty = t.table(table).empty()
    return pl.DataFrame(rows, schema=empty.schema) if rows else empty


__all__ = ["evaluate"]
