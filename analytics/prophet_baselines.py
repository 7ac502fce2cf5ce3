"""Prophet baselines: daily/weekly seasonality for series with enough history.

Optional: Prophet is imported only here, and only when used; without it
:func:`require_prophet` raises :class:`ProphetUnavailable` saying how to fix it. Series are
resampled to ``prophet_step_s`` (5 min), fitted in parallel worker processes (spawned, so
no forked Polars thread pools), and predicted up to ``prophet_refit_s`` ahead, so between
refits the stored forecast already covers new windows.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import polars as pl

from fleetlens.analytics.baselines import EXCLUDED, METHOD_PROPHET
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.provenance import read_json, write_json_atomic
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir

NS = 1_000_000_000
STATE_FILE = "prophet.json"
FILE_NAME = "prophet.parquet"


class ProphetUnavailable(RuntimeError):
    """Prophet baselines were asked for but the ``prophet`` package cannot be imported."""


def require_prophet() -> Any:
    """Import Prophet or raise :class:`ProphetUnavailable` with the fix."""
    try:
        from prophet import Prophet
    except ImportError as exc:
        raise ProphetUnavailable(
            "Prophet baselines need the 'prophet' package, which could not be imported "
            f"({exc}). Install it with `pip install prophet==1.5.0`, or set "
            "`[analytics] prophet = false` to use rolling baselines only."
        ) from exc
    return Prophet


def _fit_chunk(tasks: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
               params: dict[str, Any]) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray]]:
    """Fit and predict a chunk of series in one worker (top level: picklable)."""
    import pandas as pd

    prophet_cls = require_prophet()
    # After the import: cmdstanpy sets its logger up when it is first imported.
    for name in ("cmdstanpy", "prophet"):
        logging.getLogger(name).setLevel(logging.WARNING)
    out = []
    for series, ts, values, future in tasks:
        span_days = (ts[-1] - ts[0]) / NS / 86400
        model = prophet_cls(
            daily_seasonality=True, weekly_seasonality=span_days >= 14,
            yearly_seasonality=False, uncertainty_samples=params["uncertainty_samples"],
            interval_width=params["interval_width"],
        )
        with warnings.catch_warnings():
            # Prophet's own pandas deprecation warnings are not ours to act on.
            warnings.simplefilter("ignore")
            model.fit(pd.DataFrame({"ds": pd.to_datetime(ts, unit="ns"), "y": values}))
            forecast = model.predict(pd.DataFrame({"ds": pd.to_datetime(future, unit="ns")}))
        yhat = forecast["yhat"].to_numpy()
        if params["uncertainty_samples"] > 0:
            lower, upper = forecast["yhat_lower"].to_numpy(), forecast["yhat_upper"].to_numpy()
        else:  # band from the in-sample residuals (robust sigma)
            fitted = np.interp(ts, future, yhat)
            resid = values - fitted
            sigma = 1.4826 * np.median(np.abs(resid - np.median(resid)))
            half = params["band_k"] * sigma
            lower, upper = yhat - half, yhat + half
        out.append((series, future, yhat, lower, upper))
    return out


def resample(series: pl.DataFrame, step_s: int) -> pl.DataFrame:
    """Mean value per series and ``step_s`` bucket."""
    step = step_s * NS
    return (series.with_columns((pl.col(c.TS_NS) // step * step).alias(c.TS_NS))
            .group_by(c.SERIES, c.TS_NS).agg(pl.col(c.VALUE).mean())
            .sort(c.SERIES, c.TS_NS))


#: Runs ``fn(chunk, params)`` for every chunk somewhere else (e.g. as Ray tasks,
#: :mod:`analytics.ray_tasks`) and returns the results in chunk order.
MapChunks = Callable[[Callable[..., Any], list[Any], dict[str, Any]], list[Any]]


def fit_prophet(series: pl.DataFrame, config: AnalyticsConfig, *,
                workers: int | None = None, map_chunks: MapChunks | None = None
                ) -> pl.DataFrame:
    """Stage: long series frame -> `baselines` rows with method ``prophet``.

    Input: ``series, ts_ns, value`` rows (any step). Output grain: one row per (series,
    ``prophet_step_s`` bucket) from the series' first bucket to ``prophet_refit_s`` past its
    last. Series with less than ``prophet_min_history_s`` of data are skipped. The fits run
    in ``workers`` local processes, or through ``map_chunks`` when given (each series is
    fitted alone, so where it runs changes nothing).
    """
    require_prophet()
    step = config.prophet_step_s * NS
    frame = resample(series.select(c.SERIES, c.TS_NS, c.VALUE), config.prophet_step_s)
    spans = frame.group_by(c.SERIES).agg(pl.col(c.TS_NS).min().alias("lo"),
                                         pl.col(c.TS_NS).max().alias("hi"))
    keep = spans.filter(pl.col("hi") - pl.col("lo") >= config.prophet_min_history_s * NS)
    tasks = []
    for name, part in frame.join(keep, on=c.SERIES).group_by(c.SERIES, maintain_order=True):
        ts = part[c.TS_NS].to_numpy()
        future = np.arange(ts[0], ts[-1] + config.prophet_refit_s * NS + 1, step)
        tasks.append((name[0], ts, part[c.VALUE].to_numpy(), future))
    if not tasks:
        return t.table(t.BASELINES).empty()
    params = {"uncertainty_samples": config.prophet_uncertainty_samples,
              "interval_width": config.prophet_interval_width, "band_k": config.band_k}
    workers = workers or config.prophet_workers
    size = max(1, math.ceil(len(tasks) / (workers * 4)))
    chunks = [tasks[i:i + size] for i in range(0, len(tasks), size)]
    if map_chunks is not None:
        results = map_chunks(_fit_chunk, chunks, params)
    elif workers == 1:
        results = [_fit_chunk(chunk, params) for chunk in chunks]
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            results = list(pool.map(_fit_chunk, chunks, [params] * len(chunks)))
    parts = [
        pl.DataFrame({c.SERIES: [name] * len(ts), c.TS_NS: ts.astype(np.int64),
                      c.EXPECTED: yhat, c.LOWER: lower, c.UPPER: upper})
        for chunk in results for name, ts, yhat, lower, upper in chunk
    ]
    out = pl.concat(parts).with_columns(
        pl.col(c.LOWER).clip(lower_bound=0.0), pl.lit(METHOD_PROPHET).alias(c.METHOD))
    return out.select(list(t.table(t.BASELINES).columns))


def refresh_prophet(data_dir: DataDir, banded: pl.DataFrame, config: AnalyticsConfig, *,
                    force: bool = False, map_chunks: MapChunks | None = None) -> int:
    """Refit Prophet baselines when ``prophet_refit_s`` has passed (in data time) since the
    last fit, or when ``force``; publish them. Returns the number of series fitted (0 when
    not due). ``map_chunks``: see :func:`fit_prophet`."""
    from fleetlens.analytics.published import publish, state_dir

    state_path = state_dir(data_dir) / STATE_FILE
    state = read_json(state_path, {})
    latest = int(banded[c.TS_NS].max())
    last_fit = state.get("last_fit_data_ns")
    if not force and last_fit is not None and latest - last_fit < config.prophet_refit_s * NS:
        return 0
    chosen = banded.filter(pl.col(c.LEVEL).is_in(list(config.prophet_levels))
                           & pl.col(c.METRIC).is_in(list(config.detect_metrics)))
    if EXCLUDED in chosen.columns:  # windows inside incidents feed no baseline (issue 15)
        chosen = chosen.filter(~pl.col(EXCLUDED))
    started = time.perf_counter()
    fitted = fit_prophet(chosen, config, map_chunks=map_chunks)
    # Same extra columns as the rolling rows, so readers filter both methods alike.
    scope = chosen.select(c.SERIES, c.METRIC, c.SERVICE_NAME, c.MODEL, c.HOST_NAME,
                          c.LEVEL).unique(c.SERIES)
    fitted = fitted.join(scope, on=c.SERIES, how="left")
    publish(data_dir, t.BASELINES, fitted, c.TS_NS, name=FILE_NAME)
    n = int(fitted[c.SERIES].n_unique()) if fitted.height else 0
    write_json_atomic(state_path, {"last_fit_data_ns": latest, "series": n,
                                   "fit_seconds": round(time.perf_counter() - started, 3)})
    return n
