"""The running batch of a capacity window is the engine's batch over the window's time."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.capacity.points import (
    BATCH_TREND,
    GEN_TOK_S,
    STEADY,
    engine_windows,
    steady,
)
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


def test_the_batch_move_is_the_second_half_over_the_first() -> None:
    """The load steps from 10 to 40 at the window's middle (sampled every 10 s): the
    second half's time average minus the first's; a steady window moved nothing."""
    row = _first_window({0: 10, 10: 10, 20: 10, 30: 40, 40: 40, 50: 40, 60: 40})
    # segments by their middle: 5, 15, 25 s (10, 10, 25) and 35, 45, 55 s (40, 40, 40)
    assert row[BATCH_TREND] == pytest.approx(40 - 15)
    assert _first_window({s: 7.0 for s in range(0, 70, 10)})[BATCH_TREND] == 0.0
    # one segment in the window: no move measured (null), not a move
    assert _first_window({30: 5.0, 40: 5.0, 200: 9.0})[BATCH_TREND] is None


def test_a_window_is_steady_unless_its_batch_moved_or_its_requests_did_not_balance() -> None:
    """Steady: the batch moved by at most 2 x sqrt(batch + 1) and arrivals and completions
    differ by at most 2 x sqrt(their sum) (the Poisson noise of a steady load)."""
    windows = pl.DataFrame({
        c.BATCH: [40.0, 40.0, 40.0, 40.0, 20.0, 1.0],
        BATCH_TREND: [3.0, -12.0, 14.0, None, 0.0, 4.0],
        c.RPS: [10.0, 10.0, 10.0, 10.0, 0.0, 0.1],
        c.REQUESTS: [590, 610, 600, 600, 18, 6],
    })
    got = windows.select(steady(WINDOW_S))[STEADY].to_list()
    # 2 x sqrt(41) = 12.8: a move of 14 is a step; the load ended (0 arrivals, 18 done);
    # at batch 1 a move of 4 is over 2 x sqrt(2) = 2.8
    assert got == [True, True, False, True, False, False]
