"""Prophet baselines: seasonality is learned, work runs in worker processes, the import is
optional with a precise error."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import polars as pl
import pytest

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.prophet_baselines import ProphetUnavailable, fit_prophet, require_prophet
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema import validate

from .conftest import NS, T0


def _daily(series: str, days: float = 2.5, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ts = np.arange(0, int(days * 86400), 60) * NS + T0
    phase = 2 * np.pi * (ts - T0) / NS / 86400
    values = 1.0 + 0.5 * np.sin(phase) + rng.normal(0, 0.02, len(ts))
    return pl.DataFrame({c.SERIES: series, c.TS_NS: ts, c.VALUE: values})


@pytest.mark.slow
def test_prophet_learns_the_daily_cycle_in_worker_processes() -> None:
    cfg = dataclasses.replace(AnalyticsConfig(), prophet_refit_s=3600, prophet_workers=2)
    frame = pl.concat([_daily("a"), _daily("b", seed=1), _daily("short", days=0.5)])
    out = fit_prophet(frame, cfg)
    validate(out, t.BASELINES)
    assert set(out[c.SERIES]) == {"a", "b"}  # "short" has under 2 days of history
    assert (out[c.METHOD] == "prophet").all()
    a = out.filter(pl.col(c.SERIES) == "a").sort(c.TS_NS)
    # the forecast runs refit_s past the last point, on the 5-minute grid
    last = frame.filter(pl.col(c.SERIES) == "a")[c.TS_NS].max()
    assert a[c.TS_NS][-1] >= last + 3600 * NS - 300 * NS
    assert (a[c.TS_NS].diff().drop_nulls() == 300 * NS).all()
    # at 06:00 the sine peaks (1.5), at 18:00 it bottoms (0.5)
    hour = ((a[c.TS_NS] - T0) // NS % 86400) // 3600
    peak = a.filter(hour == 6)[c.EXPECTED].mean()
    trough = a.filter(hour == 18)[c.EXPECTED].mean()
    assert peak == pytest.approx(1.5, abs=0.1) and trough == pytest.approx(0.5, abs=0.1)
    assert (a[c.LOWER] <= a[c.EXPECTED]).all() and (a[c.EXPECTED] <= a[c.UPPER]).all()


def test_missing_prophet_gives_a_precise_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prophet", None)
    with pytest.raises(ProphetUnavailable, match=r"pip install prophet==1\.5\.0.*prophet = false"):
        require_prophet()
    with pytest.raises(ProphetUnavailable):
        fit_prophet(_daily("a", days=0.1), AnalyticsConfig())


@pytest.mark.slow
def test_refresh_prophet_publishes_on_schedule(tmp_path) -> None:
    from fleetlens.analytics.prophet_baselines import refresh_prophet
    from fleetlens.analytics.runner import read_table
    from fleetlens.pipeline.storage import DataDir

    root = DataDir(tmp_path / "data")
    series = _daily("e2e_p99_s{service_name=chat,model=m,host_name=*}", days=2.2)
    banded = series.with_columns(
        pl.lit("e2e_p99_s").alias(c.METRIC), pl.lit("chat").alias(c.SERVICE_NAME),
        pl.lit("m").alias(c.MODEL), pl.lit("*").alias(c.HOST_NAME),
        pl.lit("service").alias(c.LEVEL))
    cfg = dataclasses.replace(AnalyticsConfig(), prophet_workers=1, prophet_refit_s=3600)
    assert refresh_prophet(root, banded, cfg) == 1
    table = read_table(root, t.BASELINES)
    assert set(table[c.METHOD]) == {"prophet"} and set(table[c.METRIC]) == {"e2e_p99_s"}
    assert refresh_prophet(root, banded, cfg) == 0  # not due: same data time
    assert refresh_prophet(root, banded, cfg, force=True) == 1


@pytest.mark.slow
def test_refresh_prophet_leaves_incident_windows_out(tmp_path) -> None:
    # Issue 15: windows inside detected incidents feed no baseline, Prophet's included.
    from fleetlens.analytics.baselines import EXCLUDED
    from fleetlens.analytics.prophet_baselines import refresh_prophet
    from fleetlens.analytics.runner import read_table
    from fleetlens.pipeline.storage import DataDir

    def banded(spike: float) -> pl.DataFrame:
        frame = _daily("e2e_p99_s{service_name=chat,model=m,host_name=*}", days=2.2)
        hours = (frame[c.TS_NS] - T0) // NS / 3600
        incident = (hours >= 40) & (hours < 46)  # six hours at x`spike` inside the history
        return frame.with_columns(
            pl.when(incident).then(pl.col(c.VALUE) * spike).otherwise(pl.col(c.VALUE))
            .alias(c.VALUE),
            incident.alias(EXCLUDED), pl.lit("e2e_p99_s").alias(c.METRIC),
            pl.lit("chat").alias(c.SERVICE_NAME), pl.lit("m").alias(c.MODEL),
            pl.lit("*").alias(c.HOST_NAME), pl.lit("service").alias(c.LEVEL))

    cfg = dataclasses.replace(AnalyticsConfig(), prophet_workers=1, prophet_refit_s=3600)
    expected = []
    for spike, root in ((1.0, DataDir(tmp_path / "a")), (20.0, DataDir(tmp_path / "b"))):
        assert refresh_prophet(root, banded(spike), cfg) == 1
        expected.append(read_table(root, t.BASELINES).sort(c.TS_NS)[c.EXPECTED].to_numpy())
    assert np.allclose(expected[0], expected[1], rtol=1e-6)
