"""Headroom against the demand forecast: when the forecast peak crosses a pool's knee.

Stage ``forecast_crossing(capacity, forecast) -> capacity``: ``forecast`` is Prophet's
forecast (daily and weekly seasonality, :func:`analytics.prophet_baselines.fit_prophet`) of
each (service, model)'s arrival rate, ``prophet_refit_s`` (a day) past the end of the data,
as `baselines` rows whose ``series`` is :func:`demand_key`. A pool takes its share of its
service's demand (its share of the arrivals now); where the forecast (``expected``) of that
share passes ``knee_rps``, ``crossing_ns`` is the first such time, and ``gpus_needed`` the GPUs
to add so that the peak is at most the knee (whole instances of ``tp`` GPUs at the knee's
rate each). Only with ``[analytics] prophet = true`` and ``prophet_min_history_s`` of data.
"""

from __future__ import annotations

import math

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c

FORECAST_COLUMNS = {c.FORECAST_PEAK_RPS: pl.Float64, c.FORECAST_PEAK_NS: pl.Int64,
                    c.CROSSING_NS: pl.Int64, c.GPUS_NEEDED: pl.Int64}


def demand_key(service: str, model: str) -> str:
    """The ``series`` name of a (service, model)'s arrival rate in the forecast."""
    return f"{c.RPS}{{{c.SERVICE_NAME}={service},{c.MODEL}={model}}}"


def demand_series(windows: pl.LazyFrame) -> pl.DataFrame:
    """Each (service, model)'s arrivals per second per window (the fleet-wide rows), as
    ``series, ts_ns, value`` rows for :func:`analytics.prophet_baselines.fit_prophet`."""
    rows = (windows.filter(pl.col(c.HOST_NAME) == FLEET_WIDE)
            .select(c.SERVICE_NAME, c.MODEL, c.WINDOW_START_NS, c.RPS).collect())
    keys = [demand_key(s, m) for s, m in rows.select(c.SERVICE_NAME, c.MODEL).iter_rows()]
    return pl.DataFrame({c.SERIES: keys, c.TS_NS: rows[c.WINDOW_START_NS],
                         c.VALUE: rows[c.RPS].cast(pl.Float64)})


def forecast_crossing(capacity: pl.DataFrame, forecast: pl.DataFrame) -> pl.DataFrame:
    """Stage: `capacity` rows + the demand forecast -> the same rows with
    ``forecast_peak_rps``, ``forecast_peak_ns``, ``crossing_ns`` (null: the forecast stays
    under the knee) and ``gpus_needed`` (module docstring)."""
    service_now = capacity.group_by(c.SERVICE_NAME, c.MODEL).agg(
        pl.col(c.RPS_NOW).sum().alias("_service_now"))
    rows = []
    for row in capacity.join(service_now, on=[c.SERVICE_NAME, c.MODEL], how="left",
                             maintain_order="left").iter_rows(named=True):
        out = dict.fromkeys(FORECAST_COLUMNS)
        ahead = forecast.filter((pl.col(c.SERIES) == demand_key(row[c.SERVICE_NAME],
                                                                row[c.MODEL]))
                                & (pl.col(c.TS_NS) >= row[c.TS_NS]))
        # a pool with no rate now (an insufficient one) has no share of the forecast
        share = (row[c.RPS_NOW] / row["_service_now"]
                 if row[c.RPS_NOW] is not None and row["_service_now"] else None)
        if not ahead.is_empty() and share is not None:
            demand = ahead.with_columns((pl.col(c.EXPECTED) * share).alias("_pool"))
            peak = demand.sort("_pool", descending=True).row(0, named=True)
            out[c.FORECAST_PEAK_RPS], out[c.FORECAST_PEAK_NS] = peak["_pool"], peak[c.TS_NS]
            knee = row[c.KNEE_RPS]
            if knee:
                over = demand.filter(pl.col("_pool") > knee).sort(c.TS_NS)
                out[c.CROSSING_NS] = over[c.TS_NS][0] if over.height else None
                per_instance = knee / max(row[c.INSTANCES] or 1, 1)
                needed = math.ceil(peak["_pool"] / per_instance) - (row[c.INSTANCES] or 0)
                out[c.GPUS_NEEDED] = max(needed, 0) * int(row[c.TP] or 1)
        rows.append(out)
    extra = pl.DataFrame(rows, schema=FORECAST_COLUMNS)
    out = pl.concat([capacity.drop(list(FORECAST_COLUMNS), strict=False), extra],
                    how="horizontal")
    # the input's column order (the contract's, where columns follow the forecast ones)
    return out.select(*capacity.columns, *(n for n in FORECAST_COLUMNS
                                           if n not in capacity.columns))


def with_forecast(capacity: pl.DataFrame, windows: pl.LazyFrame,
                  config: AnalyticsConfig) -> pl.DataFrame:
    """``capacity`` with the forecast columns: Prophet fitted on :func:`demand_series` when
    ``config.prophet`` is on (nulls otherwise, or without enough history)."""
    if not config.prophet or capacity.is_empty():
        return forecast_crossing(capacity, pl.DataFrame(
            schema={c.SERIES: pl.String, c.TS_NS: pl.Int64, c.EXPECTED: pl.Float64}))
    from fleetlens.analytics.prophet_baselines import fit_prophet

    return forecast_crossing(capacity, fit_prophet(demand_series(windows), config))
