"""GPU samples at a configurable interval, energy from the native points (issue 17).

Agents sample at 10 Hz; ``gpu_samples`` keeps one row per ``gpu_sample_interval_s`` (1 s by
default) and the slot energy integrates the native points directly: counter deltas (restarts
handled), delta sums, or the trapezoid of power where no counter measured. Every expectation
is computed by hand in the comments.
"""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.pipeline import energy as en
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.samples import gpu_samples
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.settings import ConfigError
from fleetlens.pipeline.storage import DataDir, connect
from tests.pipeline.rawdata import (
    NS,
    T0,
    gpu_attrs,
    instance_gpu_point,
    point,
    points_frame,
    spans_frame,
    vllm_span,
    write_raw,
)

TENTH = NS // 10
ATTRS = gpu_attrs("GPU-0")


def _power(ts: int, watts: float, attrs: dict = ATTRS) -> dict:
    return point(a.HW_POWER, ts, watts, attrs=attrs, unit="W")


def _counter(ts: int, joules: float, attrs: dict = ATTRS) -> dict:
    return point(a.HW_ENERGY, ts, joules, attrs=attrs, unit="J", kind="sum", monotonic=True)


def _two_seconds_at_10_hz() -> pl.DataFrame:
    """Power 100 + k W, counter 10 k J, throttle bits 4 at k = 3, 1 at k = 12, 2 at k = 13."""
    bits = {3: 4.0, 12: 1.0, 13: 2.0}
    rows = []
    for k in range(20):
        ts = T0 + k * TENTH
        rows += [_power(ts, 100.0 + k), _counter(ts, 10.0 * k),
                 point(a.GPU_CLOCKS_EVENT_REASONS, ts, bits.get(k, 0.0), attrs=ATTRS)]
    return points_frame(rows)


def test_one_row_per_second_from_10_hz_points() -> None:
    out = gpu_samples(_two_seconds_at_10_hz(), 60.0)
    assert out["ts_ns"].to_list() == [T0, T0 + NS]
    assert out["power_w"].to_list() == [104.5, 114.5]  # mean of 100..109, of 110..119
    assert out["energy_j"].to_list() == [90.0, 190.0]  # the last counter reading
    assert out["clocks_event_reasons"].to_list() == [4, 3]  # every bit seen in the second
    # intervals ending at 0.1 .. 0.9 s (the first point has none), then at 1.0 .. 1.9 s
    assert out["energy_delta_j"].to_list() == [90.0, 100.0]
    assert out["gpu_uuid"].to_list() == ["GPU-0"] * 2 and out["gpu_index"].to_list() == [0, 0]


@pytest.mark.parametrize(("interval_s", "power", "delta"), [
    (0.5, [102.0, 107.0, 112.0, 117.0], [40.0, 50.0, 50.0, 50.0]),
    (10.0, [109.5], [190.0]),
    (0.1, [100.0 + k for k in range(20)], [None] + [10.0] * 19),
])
def test_the_interval_is_configurable(interval_s, power, delta) -> None:
    out = gpu_samples(_two_seconds_at_10_hz(), 60.0, interval_s)
    assert out["power_w"].to_list() == pytest.approx(power)
    assert out["energy_delta_j"].to_list() == delta
    assert out["ts_ns"].to_list() == [T0 + i * round(interval_s * NS) for i in range(len(power))]


@pytest.mark.parametrize("interval_s", [0, -1, 7, 0.7])
def test_an_interval_that_does_not_divide_the_hour_is_refused(interval_s) -> None:
    with pytest.raises(ConfigError, match="gpu_sample_interval_s"):
        PipelineConfig(gpu_sample_interval_s=interval_s).validate()


def _slots(points: pl.DataFrame) -> dict[int, tuple[int, int]]:
    out = en.gpu_slot_energy(points, 10, T0, 60.0)
    return {(s - T0) // NS: (m, cov) for s, m, cov in
            out.select("slot_start_ns", "measured_uj", "covered_ns").iter_rows()}


def test_slot_energy_from_native_counter_with_a_restart_and_a_gap() -> None:
    # 300 W: +30 J per 0.1 s, but the counter restarts at 5.0 s (reads 5 J), points stop at
    # 9.9 s and resume at 80 s (a 70.1 s gap, longer than max_sample_gap_s = 60: unmeasured).
    # Power reads 999 W throughout: the counter wins.
    values = [30.0 * k for k in range(50)] + [5.0 + 30.0 * k for k in range(50)]
    times = [T0 + k * TENTH for k in range(100)] + [T0 + 80 * NS + k * TENTH for k in range(10)]
    values += [5.0 + 30.0 * (49 + k) + 1000 for k in range(10)]
    rows = [r for ts, v in zip(times, values, strict=False)
            for r in (_counter(ts, v), _power(ts, 999.0))]
    # slot [0, 10 s): 49 x 30 J + 5 J (the restart) + 49 x 30 J over 99 intervals (9.9 s);
    # slot [80, 90 s): 9 x 30 J over 0.9 s
    assert _slots(points_frame(rows)) == {0: (2945 * 10**6, 99 * TENTH),
                                          80: (270 * 10**6, 9 * TENTH)}


def test_power_fills_in_where_the_counter_is_missing() -> None:
    # Power 200 W at 10 Hz over [0, 19.9 s]; the counter (500 W: +50 J per 0.1 s) starts at
    # 10 s. Slot [0, 10 s): 100 trapezoids of 200 W x 0.1 s = 2000 J (the one ending at 10 s
    # included); slot [10, 20 s): 99 counter intervals of 50 J = 4950 J, no power.
    rows = [_power(T0 + k * TENTH, 200.0) for k in range(200)]
    rows += [_counter(T0 + k * TENTH, 1000.0 + 50.0 * (k - 100)) for k in range(100, 200)]
    assert _slots(points_frame(rows)) == {0: (2000 * 10**6, 100 * TENTH),
                                          10: (4950 * 10**6, 99 * TENTH)}


def test_out_of_order_and_repeated_points_give_the_same_energy() -> None:
    rows = [r for k in range(100) for r in (_counter(T0 + k * TENTH, 30.0 * k),
                                            _power(T0 + k * TENTH, 300.0))]
    shuffled = points_frame(rows[::-1] + rows[:40])  # reversed, and 20 samples twice
    assert _slots(shuffled) == _slots(points_frame(rows)) == {0: (2970 * 10**6, 99 * TENTH)}


def _fleet(root, interval_s: float) -> DataDir:
    """One request decoding 100 steps over [0, 10 s) on GPU-0 (10 Hz counter at 300 W with a
    restart at 5 s); the pipeline run with ``gpu_sample_interval_s``."""
    dd = DataDir(root)
    res = {a.SERVICE_INSTANCE_ID: "i0"}
    req = vllm_span(1, start_ns=T0, e2e=10.0, queue=0.0, prefill=0.0, decode=10.0, ttft=0.0,
                    prompt=1, completion=101, res_extra=res)
    write_raw(dd, t.SPANS, spans_frame([req]))
    values = [30.0 * k for k in range(50)] + [5.0 + 30.0 * k for k in range(51)]
    rows = [r for k, v in enumerate(values) for r in (_counter(T0 + k * TENTH, v),
                                                      _power(T0 + k * TENTH, 300.0))]
    rows.append(instance_gpu_point("i0", "GPU-0", T0))
    write_raw(dd, t.METRIC_POINTS, points_frame(rows))
    Pipeline(dd, PipelineConfig(gpu_sample_interval_s=interval_s)).run_once()
    return dd


@pytest.mark.parametrize("interval_s", [1.0, 10.0])
def test_joules_per_token_do_not_depend_on_the_sample_interval(tmp_path, interval_s) -> None:
    # Slot [0, 10 s) holds the 100 intervals ending at 0.1 .. 10.0 s: 49 x 30 J, 5 J (the
    # restart), 50 x 30 J = 2975 J over 10 s, the request active the whole slot: all 2975 J
    # are its own. J/token = 2975 / 101 output tokens.
    con = connect(_fleet(tmp_path / "d", interval_s))
    energy, per_token = con.sql("select energy_j, j_per_token from request_energy").fetchall()[0]
    assert energy == pytest.approx(2975.0, abs=1e-5)
    assert per_token == pytest.approx(2975.0 / 101, abs=1e-6)
    rows, total = con.sql("select count(*), sum(energy_delta_j) from gpu_samples").fetchall()[0]
    assert rows == {1.0: 11, 10.0: 2}[interval_s]  # samples over [0, 10 s]
    assert total == pytest.approx(2975.0)  # every interval counted in one row
