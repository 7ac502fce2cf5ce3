"""The running batch of a capacity window is the engine's batch over the window's time."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.capacity.points import GEN_TOK_S, engine_windows
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
T0 = 1_767_225_600 * NS  # a window boundary
WINDOW_S = 60


def _engine(running: dict[float, float | None]) -> pl.LazyFrame:
    """One instance's samples: ``{seconds after T0: num_requests_running}``; KV usage is
    the batch / 100."""
    rows = [{c.TS_NS: T0 + round(s * NS), c.HOST_NAME: "h1", c.INSTANCE_ID: "h1/i0",
             c.MODEL: "m", c.NUM_RUNNING: b, c.NUM_WAITING: 0.0,
             c.KV_CACHE_USAGE: None if b is None else b / 100,
             c.GENERATION_TOKENS_TOTAL: 10.0 * s, c.PROMPT_TOKENS_TOTAL: 0.0}
            for s, b in running.items()]
    return conform(pl.DataFrame(rows), t.ENGINE_SAMPLES).lazy()


def _first_window(running: dict[float, float | None]) -> dict:
    found = engine_windows(_engine(running), WINDOW_S).collect()
    return found.filter(pl.col(c.WINDOW_START_NS) == T0).row(0, named=True)


def test_a_climbing_batch_counts_over_the_window_not_half_a_sample_earlier() -> None:
    """The batch climbs linearly, sampled every 10 s: the window's batch is its time
    average over [0, 60 s) (3.0), not the mean of the samples stamped in it (2.5: the
    interval half a sample earlier), which made the windows where the load stepped up
    look like a smaller batch than the one their requests decoded in."""
    row = _first_window({s: s / 10 for s in range(0, 130, 10)})
    assert row[c.BATCH] == pytest.approx(3.0)
    assert row[c.KV_CACHE_USAGE_MEAN] == pytest.approx(0.03)


def test_a_step_up_right_after_the_windows_first_sample() -> None:
    """The load steps up just after the sample at the window's start: from 10 to 40 in
    the first 10 s (linearly, as the trapezoid assumes), then 40."""
    row = _first_window({0: 10, 10: 40, 20: 40, 30: 40, 40: 40, 50: 40, 60: 40})
    assert row[c.BATCH] == pytest.approx((10 * 25 + 50 * 40) / 60)


def test_a_steady_batch_and_a_lone_sample_are_their_value() -> None:
    assert _first_window({s: 7.0 for s in range(0, 70, 10)})[c.BATCH] == pytest.approx(7.0)
    # one sample in the window, the next one more than a window later (the agent was down)
    assert _first_window({30: 5.0, 200: 9.0})[c.BATCH] == pytest.approx(5.0)


def test_the_token_rates_are_unchanged() -> None:
    row = engine_windows(_engine({s: 1.0 for s in range(0, 130, 10)}), WINDOW_S).collect()
    assert row.filter(pl.col(c.WINDOW_START_NS) == T0 + 60 * NS)[GEN_TOK_S][0] == \
        pytest.approx(10.0)


def test_an_engine_without_the_gauge_has_no_batch_not_nan() -> None:
    """An engine that does not report ``num_requests_running``: the time average was 0/0 =
    NaN, which ``coalesce`` keeps, and NaN reached the knee's least squares (LinAlgError: the
    whole analytics run stopped, the failures test's explain)."""
    row = _first_window({s: None for s in range(0, 130, 10)})
    assert row[c.BATCH] is None and row[c.KV_CACHE_USAGE_MEAN] is None
