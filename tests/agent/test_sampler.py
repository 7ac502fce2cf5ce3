"""The NVML path with the fake backend: units, energy counter wrap/reset, missing fields, a GPU
that disappears."""

from __future__ import annotations

import logging

import pytest

from fleetlens.collector.agent.fake_gpu import REASON_SW_POWER_CAP, FakeGpuBackend
from fleetlens.collector.agent.gpu import NvmlReading
from fleetlens.collector.agent.sampler import COUNTER_WRAP, EnergyTotal, GpuSampler


class Clock:
    """Seconds for the backend, ns for the sampler, advanced by the test."""

    def __init__(self) -> None:
        self.s = 1000.0

    def seconds(self) -> float:
        return self.s

    def ns(self) -> int:
        return int(self.s * 1e9)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_nvml_units_are_converted(clock: Clock) -> None:
    backend = FakeGpuBackend(2, clock=clock.seconds)
    backend.set_power(0, 350_500)  # mW
    sampler = GpuSampler(backend, clock_ns=clock.ns)
    first = sampler.sample()
    clock.s += 2.0
    second = sampler.sample()
    raw = backend.read(0)
    gpu0 = second[0]
    assert gpu0.power_w == pytest.approx(350.5)
    # 350.5 W for 2 s = 701 J, from a counter that started at 1e9 mJ
    assert gpu0.energy_j - first[0].energy_j == pytest.approx(701.0)
    assert first[0].energy_j == pytest.approx(1_000_000.0)
    assert gpu0.power_limit_w == pytest.approx(700.0)
    assert gpu0.util_gpu == pytest.approx(raw.util_gpu_pct / 100)
    assert 0.0 <= gpu0.util_gpu <= 1.0 and 0.0 <= gpu0.util_mem <= 1.0
    assert gpu0.mem_limit_bytes == 80 * 1024**3
    assert gpu0.mem_used_bytes == raw.mem_used_bytes
    assert gpu0.sm_clock_mhz == raw.sm_clock_mhz
    assert gpu0.temp_c == float(raw.temp_c)
    assert gpu0.ts_ns == clock.ns()
    assert [s.index for s in second] == [0, 1]
    assert len({s.uuid for s in second}) == 2
    assert all(s.uuid.startswith("GPU-") for s in second)


def test_convert_is_exact_on_a_known_reading() -> None:
    reading = NvmlReading(index=3, uuid="GPU-abc", name="NVIDIA A100-SXM4-80GB",
                          power_mw=123_456, energy_mj=9_876_543, util_gpu_pct=87,
                          util_mem_pct=41, mem_used_bytes=5 * 2**30, mem_total_bytes=80 * 2**30,
                          sm_clock_mhz=1410, temp_c=71, power_limit_mw=400_000,
                          clocks_event_reasons=REASON_SW_POWER_CAP, pids=(42, 7))
    s = GpuSampler(FakeGpuBackend(0)).convert(reading, ts_ns=5)
    assert (s.power_w, s.energy_j, s.util_gpu, s.util_mem) == pytest.approx(
        (123.456, 9876.543, 0.87, 0.41))
    assert (s.power_limit_w, s.temp_c, s.sm_clock_mhz) == (400.0, 71.0, 1410)
    assert s.clocks_event_reasons == 0x4
    assert (s.mem_used_bytes, s.mem_limit_bytes) == (5 * 2**30, 80 * 2**30)
    assert (s.index, s.uuid, s.name, s.pids, s.ts_ns) == (
        3, "GPU-abc", "NVIDIA A100-SXM4-80GB", (42, 7), 5)


def test_power_cap_sets_the_throttle_bit_and_lowers_the_clock(clock: Clock) -> None:
    backend = FakeGpuBackend(1, clock=clock.seconds)
    backend.set_power(0, backend.power_limit_mw)
    capped = GpuSampler(backend, clock_ns=clock.ns).sample()[0]
    assert capped.clocks_event_reasons & REASON_SW_POWER_CAP
    assert capped.sm_clock_mhz < 1980


def test_energy_counter_reset_keeps_the_total_monotonic(clock: Clock) -> None:
    backend = FakeGpuBackend(1, clock=clock.seconds)
    backend.set_power(0, 100_000)
    sampler = GpuSampler(backend, clock_ns=clock.ns)
    before = sampler.sample()[0].energy_j
    clock.s += 1.0
    backend.set_energy(0, 0)  # driver reloaded: the raw counter restarts near zero
    clock.s += 1.0
    after = sampler.sample()[0].energy_j
    # the 1 s after the reset (100 J) is counted; nothing is subtracted
    assert after - before == pytest.approx(100.0)
    assert after > before


def test_energy_counter_wrap() -> None:
    total = EnergyTotal()
    assert total.update(COUNTER_WRAP - 500) == pytest.approx((COUNTER_WRAP - 500) / 1000)
    start = total.total_mj
    total.update(1500)  # wrapped past 2**64: 500 + 1500 mJ consumed
    assert total.total_mj - start == 2000
    assert (total.wraps, total.resets) == (1, 0)
    total.update(1000)  # went back but far from the wrap point: a reset
    assert total.total_mj - start == 3000
    assert (total.wraps, total.resets) == (1, 1)


def test_missing_fields_on_older_gpus_are_none_not_zero(clock: Clock) -> None:
    backend = FakeGpuBackend(2, clock=clock.seconds, name="Tesla P100-PCIE-16GB")
    backend.drop_fields(1, "energy_mj", "clocks_event_reasons", "temp_c")
    samples = GpuSampler(backend, clock_ns=clock.ns).sample()
    old = samples[1]
    assert old.energy_j is None and old.clocks_event_reasons is None and old.temp_c is None
    assert old.power_w is not None and old.mem_used_bytes is not None
    assert samples[0].energy_j is not None
    with pytest.raises(ValueError, match="unknown reading fields"):
        backend.drop_fields(0, "no_such_field")


def test_a_gpu_that_disappears_is_skipped_and_logged_once(clock: Clock, caplog) -> None:
    backend = FakeGpuBackend(3, clock=clock.seconds)
    sampler = GpuSampler(backend, clock_ns=clock.ns)
    assert len(sampler.sample()) == 3
    backend.lose(1)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            clock.s += 0.1
            samples = sampler.sample()
            assert [s.index for s in samples] == [0, 2]
    lost_lines = [r for r in caplog.records if "stopped answering" in r.getMessage()]
    assert len(lost_lines) == 1
    backend.lose(1, lost=False)
    with caplog.at_level(logging.WARNING):
        assert [s.index for s in sampler.sample()] == [0, 1, 2]
    assert any("answers again" in r.getMessage() for r in caplog.records)
    assert sampler.lost == set()
