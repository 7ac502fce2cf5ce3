"""The numbers on the pages are analytics' numbers (one definition of each), computed here
independently from the Parquet files with the analytics functions the CLI calls."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.leaderboard import leaderboard, outside_incidents, prepare
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import scan
from tests.dashboard.test_pages import frames, open_page


def _steady_board(root) -> pl.DataFrame:  # noqa: ANN001
    """What ``fleetlens leaderboard`` computes, on the requests the page says it ranks: all of
    them but the newest window's and those during an incident of their scope."""
    newest = scan(root, t.WINDOWS).select(pl.col(c.WINDOW_START_NS).max()).collect().item()
    requests = scan(root, t.REQUESTS).filter(pl.col(c.ARRIVAL_NS) < newest).collect()
    steady = outside_incidents(requests, scan(root, t.INCIDENTS).collect())
    assert 0 < steady.height < requests.height  # the incident's requests are left out
    prepared = prepare(steady, scan(root, t.INSTANCE_GPUS).collect(),
                       scan(root, t.GPU_SAMPLES).collect(), scan(root, t.REQUEST_ENERGY).collect())
    return leaderboard(prepared, AnalyticsConfig())


def test_leaderboard_page_shows_the_analytics_leaderboard(app, demo_data) -> None:
    expected = _steady_board(demo_data[0])
    open_page(app, "leaderboard")
    (shown,) = frames(app)
    keys = [c.MODEL, c.GPU_MODEL, c.CONFIG]
    assert shown.select(keys).rows() == expected.select(keys).rows()
    for col in (c.RANK, c.RANK_LO, c.RANK_HI, c.REQUESTS, c.PARETO):
        assert shown[col].to_list() == expected[col].to_list(), col
    for col in (c.percentile_column("ttft", "p99"), c.percentile_column("e2e", "p99"),
                c.TOK_S_PER_GPU, c.J_PER_TOKEN, c.WEIGHTED_SCORE):
        assert shown[col].to_list() == pytest.approx(expected[col].to_list(), rel=1e-9), col


def test_host_p99_is_the_p99_of_the_hosts_requests(app, demo_data) -> None:
    """Not a request-weighted mean of the host's window p99s."""
    requests = scan(demo_data[0], t.REQUESTS).collect()
    truth = dict(requests.group_by(c.HOST_NAME).agg(
        pl.col(c.E2E_S).quantile(0.99, "linear")).iter_rows())
    _, hosts = frames(app)
    shown = dict(hosts.select(c.HOST_NAME, c.percentile_column("e2e", "p99")).iter_rows())
    assert shown.keys() == truth.keys()
    for host, p99 in truth.items():
        assert shown[host] == pytest.approx(p99, rel=1e-3), host  # the table rounds to 4 digits


def test_headline_p99_is_the_p99_of_the_recent_requests(app, demo_data) -> None:
    """The overview's latency headline: the p99 of the last five complete windows' requests."""
    windows = scan(demo_data[0], t.WINDOWS).select(c.WINDOW_START_NS).unique().collect()
    starts = sorted(windows[c.WINDOW_START_NS].to_list())
    recent = scan(demo_data[0], t.REQUESTS).filter(
        pl.col(c.ARRIVAL_NS).is_between(starts[-6], starts[-1], closed="left")).collect()
    p99 = recent[c.TTFT_S].quantile(0.99, "linear")
    shown = next(m for m in app.metric if m.label == "TTFT p99").value
    number, unit = shown.split()
    assert float(number.replace(",", "")) * (1e-3 if unit == "ms" else 1.0) == pytest.approx(
        p99, rel=0.01)
