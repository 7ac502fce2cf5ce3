"""One absurd value from the network is no measurement, not a pipeline that stops.

The collector stores what OTLP allows: NaN and infinite gauge values, any finite double as a
span's latency attribute, any int64 as a token count. The pipeline turns latencies into
nanoseconds and energy into integer microjoules, so one such value used to fail the cast,
and with it the whole hour, on every run, for every request and GPU in it. Each test runs
the real pipeline over raw segments and checks the bad value is read as missing while the
rest of the hour is computed as without it (expectations worked by hand in the comments).
"""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.partitions import read_hours
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.rawdata import (
    NS,
    T0,
    engine_point,
    gpu_attrs,
    gpu_points,
    instance_gpu_point,
    point,
    points_frame,
    spans_frame,
    vllm_span,
    write_raw,
)

SAMPLES = 100  # 10 s of one GPU at 10 Hz; its energy counter rises 30 J per sample
BAD_AT = 50


def _run(tmp_path, *, energy_at_bad: float | None = None, power_at_bad: float | None = None,
         mask_at_bad: float | None = None, kv_at_bad: float | None = None,
         span_override: dict | None = None) -> DataDir:
    dd = DataDir(tmp_path)
    rows = []
    for k in range(SAMPLES):
        ts = T0 + k * NS // 10
        bad = k == BAD_AT
        energy = energy_at_bad if bad and energy_at_bad is not None else 1000.0 + 30 * k
        power = power_at_bad if bad and power_at_bad is not None else 300.0
        rows += gpu_points("GPU-a", ts, power=power, energy=energy)
        mask = mask_at_bad if bad and mask_at_bad is not None else 4.0
        rows.append(point(a.GPU_CLOCKS_EVENT_REASONS, ts, mask, attrs=gpu_attrs("GPU-a")))
        rows.append(instance_gpu_point("h1/svc", "GPU-a", ts))
        kv = kv_at_bad if bad and kv_at_bad is not None else 0.5
        rows.append(engine_point(a.ENGINE_KV_CACHE_USAGE, "h1/svc", ts, kv))
    write_raw(dd, t.METRIC_POINTS, points_frame(rows), seq=1)
    spans = [vllm_span(i, start_ns=T0 + i * NS // 5) for i in range(20)]
    spans[3].update(span_override or {})
    write_raw(dd, t.SPANS, spans_frame(spans), seq=1)
    Pipeline(dd, PipelineConfig()).run_once()
    return dd


def _table(dd: DataDir, table: str) -> pl.DataFrame:
    return read_hours(dd, table, [T0])


def _measured_j(dd: DataDir) -> float:
    return _table(dd, t.GPU_SLOT_ENERGY).get_column(c.MEASURED_UJ).sum() / 1e6


@pytest.mark.parametrize("column", [c.GEN_AI_TTFT_S, c.GEN_AI_TIME_IN_QUEUE_S,
                                    c.GEN_AI_PREFILL_S, c.GEN_AI_DECODE_S, c.GEN_AI_E2E_S])
@pytest.mark.parametrize("value", [1e300, 1e10, float("nan")])
def test_an_absurd_latency_on_one_span_is_missing_and_the_hour_is_computed(
        tmp_path, column: str, value: float) -> None:
    # 1e10 s is 317 years: in nanoseconds more than an int64 holds
    dd = _run(tmp_path, span_override={column: value})
    clean = _run(tmp_path / "clean")
    requests = _table(dd, t.REQUESTS).sort(c.ARRIVAL_NS)
    assert requests.height == 20
    out = {c.GEN_AI_TTFT_S: c.TTFT_S, c.GEN_AI_TIME_IN_QUEUE_S: c.QUEUE_S,
           c.GEN_AI_PREFILL_S: c.PREFILL_S, c.GEN_AI_DECODE_S: c.DECODE_S,
           c.GEN_AI_E2E_S: c.E2E_S}[column]
    bad = requests.row(3, named=True)
    if column == c.GEN_AI_E2E_S:  # a missing e2e is the span's own duration (1 s)
        assert bad[out] == pytest.approx(1.0)
    elif column in (c.GEN_AI_PREFILL_S, c.GEN_AI_DECODE_S):
        # a missing phase comes back from the span's inference (0.8 s) less the other phase
        assert bad[out] == pytest.approx(0.2 if column == c.GEN_AI_PREFILL_S else 0.6)
    else:
        assert bad[out] is None
    # every other request is as in a run without the bad span
    others = requests.filter(pl.int_range(pl.len()) != 3)
    expected = _table(clean, t.REQUESTS).sort(c.ARRIVAL_NS).filter(pl.int_range(pl.len()) != 3)
    assert others.equals(expected)
    energy = _table(dd, t.REQUEST_ENERGY).get_column(c.ENERGY_J)
    assert energy.len() == 20 and energy.is_finite().all()
    assert _table(dd, t.WINDOWS).height == _table(clean, t.WINDOWS).height


@pytest.mark.parametrize(("column", "value"), [
    (c.GEN_AI_PROMPT_TOKENS, 1 << 62), (c.GEN_AI_COMPLETION_TOKENS, 1 << 62),
    (c.GEN_AI_PROMPT_TOKENS, -5)])
def test_an_absurd_token_count_is_missing(tmp_path, column: str, value: int) -> None:
    # 2^62 tokens x 1000 milli-tokens wrapped around int64: negative energy weights
    dd = _run(tmp_path, span_override={column: value})
    requests = _table(dd, t.REQUESTS).sort(c.ARRIVAL_NS)
    out = c.INPUT_TOKENS if column == c.GEN_AI_PROMPT_TOKENS else c.OUTPUT_TOKENS
    assert requests.row(3, named=True)[out] is None
    energy = _table(dd, t.REQUEST_ENERGY).get_column(c.ENERGY_J)
    assert energy.is_finite().all() and (energy >= 0).all()


@pytest.mark.parametrize(("energy", "expected_j"), [
    # the point is dropped when read: the interval 49 -> 51 holds its 60 J, nothing is lost
    (float("nan"), 99 * 30.0), (float("inf"), 99 * 30.0),
    # a finite jump: 49 -> 50 implies 1e301 W and 50 -> 51 (a "restart" to 2530 J in 0.1 s)
    # 25 kW, above MAX_GPU_POWER_W: both are no measurement, 60 J of the 2970 unmeasured
    (1e300, 97 * 30.0),
])
def test_an_absurd_energy_reading_is_no_measurement(tmp_path, energy: float,
                                                     expected_j: float) -> None:
    dd = _run(tmp_path, energy_at_bad=energy)
    assert _measured_j(dd) == pytest.approx(expected_j)
    gpu = _table(dd, t.GPU_SAMPLES)
    assert gpu.get_column(c.ENERGY_DELTA_J).drop_nulls().is_finite().all()
    assert _table(dd, t.REQUEST_ENERGY).get_column(c.ENERGY_J).is_finite().all()


def test_nan_gauges_and_an_absurd_throttle_mask_are_no_readings(tmp_path) -> None:
    dd = _run(tmp_path, power_at_bad=float("nan"), kv_at_bad=float("nan"), mask_at_bad=1e300)
    gpu = _table(dd, t.GPU_SAMPLES)
    # the NaN power reading is left out of its second's mean: every second reads 300 W
    assert gpu.get_column(c.POWER_W).to_list() == [300.0] * 10
    # the 1e300 "mask" holds no bits: its second keeps those of the other nine readings
    assert gpu.get_column(c.CLOCKS_EVENT_REASONS).to_list() == [4] * 10
    engine = _table(dd, t.ENGINE_SAMPLES)
    assert engine.height == SAMPLES - 1  # the NaN sample is no sample
    assert engine.get_column(c.KV_CACHE_USAGE).is_finite().all()
