"""The real pynvml backend's own code (field reads, NotSupported -> None, lost GPU, the
temperature fallback) against a driver stand-in: the real ``pynvml`` module with its library
calls replaced, so its real exception classes and constants are used."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from fleetlens.collector.agent.gpu import GpuLost, NoGpu, PynvmlBackend
from fleetlens.collector.agent.sampler import GpuSampler


class Driver:
    """What two GPUs would answer: GPU 0 a modern H100, GPU 1 an old P100."""

    def __init__(self) -> None:
        self.lost: set[int] = set()
        self.init_error: Exception | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        nv = pynvml

        def handle(i):
            if i in self.lost:
                raise nv.NVMLError_GpuIsLost()
            return SimpleNamespace(i=i)

        def per_gpu(values, unsupported_on=()):
            def call(h, *args):
                if h.i in self.lost:
                    raise nv.NVMLError_GpuIsLost()
                if h.i in unsupported_on:
                    raise nv.NVMLError_NotSupported()
                return values[h.i]
            return call

        def init():
            if self.init_error:
                raise self.init_error

        def temperature_v(h, sensor):
            if h.i == 1:
                raise nv.NVMLError_FunctionNotFound()  # old driver: no versioned call
            assert sensor == nv.NVML_TEMPERATURE_GPU
            return 64

        patches = {
            "nvmlInit": init, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": handle,
            "nvmlDeviceGetUUID": per_gpu(["GPU-aaaa", "GPU-bbbb"]),
            "nvmlDeviceGetName": per_gpu(["NVIDIA H100 80GB HBM3", "Tesla P100-PCIE-16GB"]),
            "nvmlDeviceGetPowerUsage": per_gpu([612_345, 180_000]),
            "nvmlDeviceGetTotalEnergyConsumption": per_gpu([9_000_000, 0], unsupported_on=(1,)),
            "nvmlDeviceGetUtilizationRates": per_gpu(
                [SimpleNamespace(gpu=97, memory=55), SimpleNamespace(gpu=10, memory=3)]),
            "nvmlDeviceGetMemoryInfo": per_gpu(
                [SimpleNamespace(used=70 * 2**30, total=80 * 2**30),
                 SimpleNamespace(used=2**30, total=16 * 2**30)]),
            "nvmlDeviceGetClockInfo": lambda h, clock: per_gpu([1755, 1189])(h),
            "nvmlDeviceGetTemperatureV": temperature_v,
            "nvmlDeviceGetTemperature": lambda h, sensor: per_gpu([64, 41])(h),
            "nvmlDeviceGetEnforcedPowerLimit": per_gpu([700_000, 250_000]),
            "nvmlDeviceGetCurrentClocksEventReasons": per_gpu([0x4, 0], unsupported_on=(1,)),
            "nvmlDeviceGetComputeRunningProcesses": per_gpu(
                [[SimpleNamespace(pid=4242), SimpleNamespace(pid=17), SimpleNamespace(pid=4242)],
                 []]),
        }
        for name, fn in patches.items():
            monkeypatch.setattr(nv, name, fn)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Driver:
    d = Driver()
    d.install(monkeypatch)
    return d


def test_reads_every_field_in_nvml_units(driver: Driver) -> None:
    backend = PynvmlBackend()
    h100 = backend.read(0)
    assert (h100.uuid, h100.name, h100.power_mw, h100.energy_mj) == (
        "GPU-aaaa", "NVIDIA H100 80GB HBM3", 612_345, 9_000_000)
    assert (h100.util_gpu_pct, h100.util_mem_pct, h100.sm_clock_mhz, h100.temp_c) == (
        97, 55, 1755, 64)
    assert (h100.mem_used_bytes, h100.mem_total_bytes) == (70 * 2**30, 80 * 2**30)
    assert (h100.power_limit_mw, h100.clocks_event_reasons, h100.pids) == (
        700_000, 0x4, (17, 4242))
    sample = GpuSampler(backend).convert(h100, ts_ns=1)
    assert (sample.power_w, sample.energy_j, sample.power_limit_w) == (612.345, 9000.0, 700.0)


def test_old_gpu_unsupported_fields_are_none_and_temperature_falls_back(driver: Driver) -> None:
    p100 = PynvmlBackend().read(1)
    assert p100.energy_mj is None and p100.clocks_event_reasons is None
    assert p100.temp_c == 41 and p100.power_mw == 180_000 and p100.pids == ()


def test_lost_gpu_raises_gpulost_and_the_sampler_skips_it(driver: Driver) -> None:
    backend = PynvmlBackend()
    sampler = GpuSampler(backend)
    assert [s.uuid for s in sampler.sample()] == ["GPU-aaaa", "GPU-bbbb"]
    driver.lost.add(0)
    with pytest.raises(GpuLost):
        backend.read(0)
    assert [s.uuid for s in sampler.sample()] == ["GPU-bbbb"]
    driver.lost.clear()
    assert len(sampler.sample()) == 2


def test_init_failures_become_nogpu_with_nvml_message(driver: Driver) -> None:
    driver.init_error = pynvml.NVMLError_DriverNotLoaded()
    with pytest.raises(NoGpu, match="Driver Not Loaded"):
        PynvmlBackend()


def test_a_failing_field_is_no_point_said_once_and_a_lost_gpu_gets_a_new_handle(
        driver: Driver, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    import logging

    backend = PynvmlBackend()
    backend.read(0)
    real_power, real_handle = pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetHandleByIndex
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage",
                        lambda h: (_ for _ in ()).throw(pynvml.NVMLError_Timeout()))
    with caplog.at_level(logging.WARNING):
        first, second = backend.read(0), backend.read(0)
    assert first.power_mw is None and second.power_mw is None and first.temp_c == 64
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("GPU 0: reading power failed") and "Timeout" in said
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", real_power)

    handles = []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex",
                        lambda i: handles.append(i) or real_handle(i))
    driver.lost.add(0)  # a field read finds it lost (the cached handle is still used)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: "GPU-aaaa")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA H100 80GB HBM3")
    with pytest.raises(GpuLost):
        backend.read(0)
    driver.lost.clear()  # back after a reset
    assert backend.read(0).power_mw == 612_345
    assert handles == [0]  # looked up again, not the stale one reused
