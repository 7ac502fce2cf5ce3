"""Issue 16, item 5 (pipeline side): a clock running ahead cannot blind a host.

Fed through a real collector whose future bound was loosened (an older collector, or one
configured so), the pipeline still bounds what one row can do: a span dated six days ahead
moves its host's watermark at most ``FUTURE_NS`` past the span's receive time (it used to make
the next 20 genuine spans "too late"), and a span from -6.9 to +6.9 days dirties a couple of
hours (it used to dirty 332).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleetlens.collector.testing import running_collector, trace_request, vllm_span
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.discovery import FUTURE_NS
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir

pytestmark = pytest.mark.e2e
NS, DAY = 10**9, 86400 * 10**9
#: A collector that takes timestamps up to 8 days either side of its clock.
LOOSE = {"max_clock_skew_s": 8 * 86400.0, "max_future_skew_s": 8 * 86400.0,
         "flush_interval_s": 0.2}


def _send(data: Path, spans) -> None:
    with running_collector(data, config=LOOSE) as col:
        response = col.export(trace_request(spans, host_name="gpu-07"))
        assert not response.HasField("partial_success")
        assert col.stop() == 0


def test_a_span_dated_days_ahead_does_not_make_genuine_spans_late(tmp_path) -> None:
    data = tmp_path / "data"
    now = time.time_ns()
    _send(data, [vllm_span(start_ns=now - 60 * NS + i * NS) for i in range(5)]
          + [vllm_span(start_ns=now + 6 * DAY)])
    job = Pipeline(DataDir(data), PipelineConfig(lateness_s=300))
    job.run_once()
    mark = PipelineState.load(DataDir(data)).watermarks["gpu-07"]
    assert mark <= time.time_ns() + FUTURE_NS  # not six days ahead
    # genuine spans received after the bad one: the bound lets the watermark run at most
    # FUTURE_NS past that receipt, which the lateness (300 s) absorbs
    _send(data, [vllm_span(start_ns=time.time_ns()) for _ in range(20)])
    summary = job.run_once()
    assert summary.new_rows == 20
    assert summary.too_late_rows == 0  # was 20


def test_the_pipeline_bound_is_configurable(tmp_path) -> None:
    data = tmp_path / "data"
    before = time.time_ns()
    _send(data, [vllm_span(start_ns=before + 6 * DAY)])
    Pipeline(DataDir(data), PipelineConfig(max_future_skew_s=3600)).run_once()
    mark = PipelineState.load(DataDir(data)).watermarks["gpu-07"]
    assert before + 3600 * NS <= mark <= time.time_ns() + 3600 * NS


def test_one_span_across_two_weeks_dirties_a_bounded_number_of_hours(tmp_path) -> None:
    data = tmp_path / "data"
    now = time.time_ns()
    span = vllm_span(start_ns=now - int(6.9 * DAY))
    span.end_time_unix_nano = now + int(6.9 * DAY)
    _send(data, [span])
    summary = Pipeline(DataDir(data), PipelineConfig()).run_once()
    # max_request_s (3600 s) from its start: its own hour and the next, not 332 hours
    assert 1 <= summary.dirty_hours <= 2
