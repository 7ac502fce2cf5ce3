"""Issue 16, item 5 (collector side): timestamps ahead of the collector's clock are bounded
tightly (``max_future_skew_s``, 300 s by default), the past loosely (``max_clock_skew_s``).

One span dated six days ahead used to be accepted and moved its host's watermark six days on,
so every genuine span after it was dropped by the pipeline as too late.
"""

from __future__ import annotations

import time

import pytest

from fleetlens.collector.testing import (
    gauge_request,
    log_request,
    running_collector,
    trace_request,
    vllm_span,
)
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = pytest.mark.e2e
NS, DAY = 10**9, 86400 * 10**9


def test_spans_points_and_logs_dated_ahead_are_rejected_by_default(tmp_path) -> None:
    data = tmp_path / "data"
    now = time.time_ns()
    with running_collector(data) as col:
        offsets = {"six days ahead": 6 * DAY, "an hour ahead": 3600 * NS,
                   "two minutes ahead": 120 * NS, "six days ago": -6 * DAY}
        spans = [vllm_span(start_ns=now + offset) for offset in offsets.values()]
        response = col.export(trace_request(spans))
        assert response.partial_success.rejected_spans == 2
        assert "(in the future)" in response.partial_success.error_message
        response = col.export(gauge_request("g", [(now + 3600 * NS, 1.0, {}),
                                                  (now + 60 * NS, 2.0, {})]))
        assert response.partial_success.rejected_data_points == 1
        response = col.export(log_request(["ahead"], ts_ns=now + DAY))
        assert response.partial_success.rejected_log_records == 1
        assert col.stop() == 0
    stored = scan(DataDir(data), t.SPANS).collect()
    assert sorted(stored[c.START_NS].to_list()) == sorted(
        s.start_time_unix_nano for s in spans[2:])


def test_the_future_bound_is_configurable(tmp_path) -> None:
    now = time.time_ns()
    with running_collector(tmp_path / "data", config={"max_future_skew_s": 30.0}) as col:
        response = col.export(trace_request([vllm_span(start_ns=now + 120 * NS),
                                             vllm_span(start_ns=now - 60 * NS)]))
        assert response.partial_success.rejected_spans == 1
        assert "more than 30 s from now (in the future)" in \
            response.partial_success.error_message
