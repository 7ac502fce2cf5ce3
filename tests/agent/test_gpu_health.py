"""GPU health (issue 30): Xid events, ECC errors, remapped rows and lost GPUs, through the agent's
GPU loop step and the real OTLP exporter, from the fake NVML backend with injected faults, from
the real pynvml backend against a driver stand-in (the real ``pynvml`` with its library calls
replaced), and from a dcgm-exporter page over real HTTP."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from fleetlens.collector.agent.fake_gpu import FakeGpuBackend
from fleetlens.collector.agent.gpu import GpuLost, PynvmlBackend
from fleetlens.collector.agent.runner import Agent
from fleetlens.collector.agent.sampler import GpuSampler
from fleetlens.pipeline.schema import attributes as a
from tests.agent.otlp_sink import OtlpSink, Point
from tests.agent.test_agent import make_agent, sink  # noqa: F401  (fixture)
from tests.agent.test_dcgm import DCGM, GPU0, GPU2
from tests.agent.test_pynvml_backend import driver  # noqa: F401  (fixture)

HEALTH = {a.GPU_XID_ERRORS, a.GPU_ECC_ERRORS, a.GPU_REMAPPED_ROWS, a.GPU_LOST}


def tick(agent: Agent, sink: OtlpSink) -> list[Point]:  # noqa: F811
    before = len(sink.points())
    agent.gpu_tick()
    assert agent.gpu_outbox.flush()
    return sink.points()[before:]


def by_gpu(points: list[Point], name: str, key: str) -> dict[tuple[int, object], float]:
    return {(p.attributes[a.GPU_INDEX], p.attributes[key] if key else None): p.value
            for p in points if p.name == name}


def test_injected_xid_ecc_remap_and_loss_reach_the_collector(sink) -> None:  # noqa: F811
    backend = FakeGpuBackend(2)
    agent = make_agent(sink, backend)
    agent.health_interval_s = 0.0  # every tick reads health
    points = tick(agent, sink)
    uuid0, uuid1 = (s.uuid for s in agent.gpu_state.samples)
    assert [p for p in points if p.name == a.GPU_XID_ERRORS] == []  # none yet: no series
    ecc = [p for p in points if p.name == a.GPU_ECC_ERRORS]
    assert len(ecc) == 8 and {p.value for p in ecc} == {0}
    assert all(p.kind == "sum" and p.is_monotonic and p.unit == "{error}" for p in ecc)
    assert by_gpu(points, a.GPU_LOST, "") == {(0, None): 0, (1, None): 0}
    assert by_gpu(points, a.GPU_REMAPPED_ROWS, a.GPU_REMAP_KIND)[(0, "pending")] == 0

    backend.inject_xid(1, 79)
    backend.inject_xid(1, 79)
    backend.inject_xid(1, 48)
    backend.add_ecc_errors(0, "uncorrected", 2)
    backend.add_ecc_errors(0, "corrected", 5)
    backend.set_remapped_rows(0, uncorrectable=3, pending=1)
    points = tick(agent, sink)
    xid = [p for p in points if p.name == a.GPU_XID_ERRORS]
    assert {(p.attributes[a.HW_ID], p.attributes[a.GPU_XID_CODE]): p.value for p in xid} == {
        (uuid1, 79): 2, (uuid1, 48): 1}
    assert all(p.kind == "sum" and p.is_monotonic for p in xid)
    ecc = {(p.attributes[a.HW_ID], p.attributes[a.GPU_ECC_TYPE],
            p.attributes[a.GPU_ECC_COUNTER]): p.value
           for p in points if p.name == a.GPU_ECC_ERRORS}
    assert ecc[(uuid0, "uncorrected", "volatile")] == ecc[(uuid0, "uncorrected",
                                                            "aggregate")] == 2
    assert ecc[(uuid0, "corrected", "volatile")] == 5 and ecc[(uuid1, "corrected",
                                                               "volatile")] == 0
    rows = by_gpu(points, a.GPU_REMAPPED_ROWS, a.GPU_REMAP_KIND)
    assert (rows[(0, "uncorrectable")], rows[(0, "pending")], rows[(0, "failure")]) == (3, 1, 0)

    backend.lose(1)
    points = tick(agent, sink)
    lost = {p.attributes[a.GPU_INDEX]: p for p in points if p.name == a.GPU_LOST}
    assert (lost[0].value, lost[1].value) == (0, 1)
    assert lost[1].attributes[a.HW_ID] == uuid1  # the identity it last answered with
    assert [p.attributes[a.GPU_INDEX] for p in points if p.name == a.HW_POWER] == [0]
    still = {p.attributes[a.GPU_XID_CODE]: p.value for p in points if p.name == a.GPU_XID_ERRORS}
    assert still == {79: 2, 48: 1}  # cumulative: kept while the GPU is gone
    assert not [p for p in points if p.name == a.GPU_ECC_ERRORS
                and p.attributes[a.GPU_INDEX] == 1]


def test_health_is_read_once_per_interval_not_at_every_sample(sink) -> None:  # noqa: F811
    agent = make_agent(sink, FakeGpuBackend(2))
    agent.health_interval_s = 3600.0
    points = [p for _ in range(5) for p in tick(agent, sink)]
    assert len([p for p in points if p.name == a.GPU_LOST]) == 2  # the first tick only
    assert len([p for p in points if p.name == a.HW_POWER]) == 10


def test_unsupported_ecc_and_remap_are_absent_not_zero(sink) -> None:  # noqa: F811
    backend = FakeGpuBackend(2)
    backend.drop_fields(0, "ecc", "remapped_rows")  # e.g. a consumer board
    points = tick(make_agent(sink, backend), sink)
    for name in (a.GPU_ECC_ERRORS, a.GPU_REMAPPED_ROWS):
        assert {p.attributes[a.GPU_INDEX] for p in points if p.name == name} == {1}
    assert {p.attributes[a.GPU_INDEX] for p in points if p.name == a.HW_POWER} == {0, 1}


class Events:
    """NVML's event set as the driver would answer: queued events, then Timeout."""

    def __init__(self, lost: set[int]) -> None:
        self.lost = lost  # the driver's lost GPUs
        self.queue: list[SimpleNamespace] = []
        self.registered: list[int] = []
        self.waits: list[int] = []
        self.freed = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        nv = pynvml

        def register(handle, types, event_set):
            assert types == nv.nvmlEventTypeXidCriticalError and event_set == "set"
            if handle.i == 1:
                raise nv.NVMLError_NotSupported()  # this board: no events
            self.registered.append(handle.i)

        def wait(event_set, timeout_ms):
            self.waits.append(timeout_ms)
            if not self.queue:
                raise nv.NVMLError_Timeout()
            return self.queue.pop(0)

        def remapped(handle):
            if handle.i in self.lost:
                raise nv.NVMLError_GpuIsLost()
            return (0, 2, 1, 0)

        def ecc(handle, error_type, counter_type):
            if handle.i in self.lost:
                raise nv.NVMLError_GpuIsLost()
            if handle.i == 1:
                raise nv.NVMLError_NotSupported()  # ECC off
            return {(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC): 4}.get(
                (error_type, counter_type), 0)

        for name, fn in {
            "nvmlEventSetCreate": lambda: "set", "nvmlDeviceRegisterEvents": register,
            "nvmlEventSetWait_v2": wait, "nvmlEventSetFree": lambda s: setattr(
                self, "freed", True),
            "nvmlDeviceGetTotalEccErrors": ecc,
            "nvmlDeviceGetRemappedRows": remapped,
        }.items():
            monkeypatch.setattr(nv, name, fn)


def test_pynvml_backend_reads_events_ecc_and_remap(driver, monkeypatch) -> None:  # noqa: F811
    events = Events(driver.lost)
    events.install(monkeypatch)
    backend = PynvmlBackend()
    sampler = GpuSampler(backend)
    sampler.sample()
    assert backend.xid_events() == [] and events.registered == [0]
    handle0 = backend._handle(0)
    xid = pynvml.nvmlEventTypeXidCriticalError
    events.queue += [SimpleNamespace(device=handle0, eventType=xid, eventData=79)] * 2
    h0, h1 = sampler.health()
    assert h0.xid == {79: 2} and h1.xid == {}
    assert set(events.waits) == {0}  # polled, never waited on
    assert h0.ecc[("uncorrected", "volatile")] == 4 and h0.ecc[("corrected", "aggregate")] == 0
    assert h1.ecc == {}  # NotSupported: skipped quietly
    assert h0.remapped_rows == {"correctable": 0, "uncorrectable": 2, "pending": 1,
                                "failure": 0}
    assert sampler.health()[0].xid == {79: 2}  # no new event: the count stays

    driver.lost.add(1)
    with pytest.raises(GpuLost):
        backend.health(1)
    h0, h1 = sampler.health()
    assert (h0.lost, h1.lost, h1.uuid) == (False, True, "GPU-bbbb")
    assert [s.uuid for s in sampler.sample()] == ["GPU-aaaa"]  # the other GPU goes on
    backend.close()
    assert events.freed


def test_dcgm_ecc_and_row_remap_fields(sink) -> None:  # noqa: F811
    from tests.agent.test_dcgm import _server

    labels = f'gpu="0",UUID="{GPU0}",modelName="NVIDIA H100 80GB HBM3"'
    blank = f'gpu="2",UUID="{GPU2}",modelName="NVIDIA H100 80GB HBM3"'
    extra = "".join(
        f"# TYPE {field} counter\n{field}{{{labels}}} {value}\n{field}{{{blank}}} "
        "9223372036854775794\n"
        for field, value in [(a.DCGM_ECC_SBE_VOL_TOTAL, 12), (a.DCGM_ECC_DBE_VOL_TOTAL, 1),
                             (a.DCGM_ECC_SBE_AGG_TOTAL, 40), (a.DCGM_ECC_DBE_AGG_TOTAL, 2),
                             (a.DCGM_CORRECTABLE_REMAPPED_ROWS, 5),
                             (a.DCGM_UNCORRECTABLE_REMAPPED_ROWS, 1),
                             (a.DCGM_ROW_REMAP_PENDING, 1), (a.DCGM_ROW_REMAP_FAILURE, 0)])
    server, handler = _server()
    handler.body = (DCGM + extra).encode()
    try:
        agent = make_agent(sink, None, dcgm=f"http://127.0.0.1:{server.server_address[1]}"
                                            "/metrics")
        points = tick(agent, sink)
    finally:
        server.shutdown()
        server.server_close()
    ecc = {(p.attributes[a.GPU_ECC_TYPE], p.attributes[a.GPU_ECC_COUNTER]): p.value
           for p in points if p.name == a.GPU_ECC_ERRORS and p.attributes[a.HW_ID] == GPU0}
    assert ecc == {("corrected", "volatile"): 12, ("uncorrected", "volatile"): 1,
                   ("corrected", "aggregate"): 40, ("uncorrected", "aggregate"): 2}
    rows = {p.attributes[a.GPU_REMAP_KIND]: p.value for p in points
            if p.name == a.GPU_REMAPPED_ROWS and p.attributes[a.HW_ID] == GPU0}
    assert rows == {"correctable": 5, "uncorrectable": 1, "pending": 1, "failure": 0}
    # DCGM's blank is no reading; DCGM says nothing of lost GPUs; the last Xid as before
    assert {p.attributes[a.HW_ID] for p in points if p.name in HEALTH} == {GPU0}
    assert not [p for p in points if p.name == a.GPU_LOST]
    assert {p.attributes[a.HW_ID]: p.value for p in points if p.name == a.GPU_XID_LAST}[
        GPU2] == 31
