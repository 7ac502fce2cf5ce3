"""GPU sampling: NVML readings converted to exported units, with a monotonic energy total.

Conversions (NVML -> OpenTelemetry hardware conventions): power mW -> W, energy mJ -> J,
utilisation % -> 0..1, power limit mW -> W; bytes, MHz, Celsius and the clocks-event bitmask
pass through.

Energy: NVML's counter (``nvmlDeviceGetTotalEnergyConsumption``) counts mJ since the driver
loaded. The exported ``hw.energy`` is a cumulative sum that must never go down, so the agent
keeps its own total per GPU: it starts at the counter's first value and adds each positive
difference. When the raw counter goes backwards it either wrapped (the previous value was in
the top half of the unsigned 64-bit range: add the distance to the wrap point) or was reset by
a driver reload (count the new value as energy since the reset).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetlens.collector.agent.gpu import GpuBackend, GpuLost, NvmlReading
from fleetlens.collector.agent.gpu_health import GpuHealthSample, XidCounts

log = logging.getLogger(__name__)

COUNTER_WRAP = 2**64  # nvmlDeviceGetTotalEnergyConsumption returns an unsigned long long


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant, in exported units; ``None`` where the GPU lacks the field."""

    ts_ns: int
    index: int
    uuid: str
    name: str
    power_w: float | None
    energy_j: float | None
    util_gpu: float | None
    util_mem: float | None
    mem_used_bytes: int | None
    mem_limit_bytes: int | None
    sm_clock_mhz: int | None
    temp_c: float | None
    power_limit_w: float | None
    clocks_event_reasons: int | None
    pids: tuple[int, ...]
    #: Kubernetes pods using the GPU, ``namespace/pod`` (dcgm-exporter's labels; NVML: none).
    pods: tuple[str, ...] = ()
    #: Further gauges by metric name (dcgm-exporter's profiling ratios, last XID).
    extra: dict[str, float] = field(default_factory=dict)
    #: ECC and row-remap readings that came with the sample (dcgm-exporter; NVML: ``None``,
    #: its health is read apart, :meth:`GpuSampler.health`).
    health: GpuHealthSample | None = None

    @property
    def mem_used_fraction(self) -> float | None:
        """Memory used / memory size (``hw.gpu.memory.utilization`` in the conventions)."""
        if self.mem_used_bytes is None or not self.mem_limit_bytes:
            return None
        return self.mem_used_bytes / self.mem_limit_bytes


class EnergyTotal:
    """A never-decreasing energy total (J) fed with raw NVML counter values (mJ)."""

    def __init__(self) -> None:
        self._last_mj: int | None = None
        self.total_mj = 0
        self.resets = 0
        self.wraps = 0

    def update(self, raw_mj: int) -> float:
        """Feed the counter's current value; returns the total in joules."""
        if self._last_mj is None:
            self.total_mj = raw_mj
        elif raw_mj >= self._last_mj:
            self.total_mj += raw_mj - self._last_mj
        elif self._last_mj >= COUNTER_WRAP // 2:
            self.wraps += 1
            self.total_mj += COUNTER_WRAP - self._last_mj + raw_mj
        else:
            self.resets += 1
            self.total_mj += raw_mj
        self._last_mj = raw_mj
        return self.total_mj / 1000.0


def _scaled(value: int | None, factor: float) -> float | None:
    return None if value is None else value * factor


class GpuSampler:
    """Reads every GPU of a backend and converts the readings.

    A GPU that stops answering is logged once and skipped until it answers again; the other
    GPUs keep being sampled.
    """

    def __init__(self, backend: GpuBackend, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.backend = backend
        self._clock_ns = clock_ns
        self._energy: dict[str, EnergyTotal] = {}
        self.lost: set[int] = set()
        self._identity: dict[int, tuple[str, str]] = {}  # index -> (uuid, name) last read
        self.xids = XidCounts()

    def close(self) -> None:
        """Release NVML (the agent calls it at shutdown)."""
        self.backend.close()

    def sample(self) -> list[GpuSample]:
        """One sample per answering GPU."""
        out = []
        for index in range(self.backend.device_count()):
            try:
                reading = self.backend.read(index)
            except GpuLost as exc:
                self._mark_lost(index, exc)
                continue
            if index in self.lost:
                log.warning("GPU %d (%s) answers again", index, reading.uuid)
                self.lost.discard(index)
            self._identity[index] = (reading.uuid, reading.name)
            out.append(self.convert(reading, self._clock_ns()))
        return out

    def _mark_lost(self, index: int, exc: Exception) -> None:
        if index not in self.lost:
            log.warning("GPU %d stopped answering (%s); skipping it", index, exc)
            self.lost.add(index)

    def health(self) -> list[GpuHealthSample]:
        """Xid counts, ECC totals and remapped rows of every GPU read so far, and the lost
        ones (``lost``, with the identity they last answered with). Slower than
        :meth:`sample`: the agent calls it once per export interval."""
        for index, code in self.backend.xid_events():
            # Said once per GPU and code: a storm of one Xid would flood the log.
            if code not in self.xids.of(index):
                log.warning("GPU %d: Xid %d (later ones are counted, not logged)", index, code)
            self.xids.add(index, code)
        out = []
        for index in range(self.backend.device_count()):
            uuid, name = self._identity.get(index, ("", ""))
            if index not in self.lost and index in self._identity:
                try:
                    health = self.backend.health(index)
                except GpuLost as exc:
                    self._mark_lost(index, exc)
                else:
                    out.append(GpuHealthSample(index, uuid, name, xid=self.xids.of(index),
                                               ecc=dict(health.ecc),
                                               remapped_rows=dict(health.remapped_rows)))
                    continue
            if index in self.lost:
                out.append(GpuHealthSample(index, uuid, name, lost=True,
                                           xid=self.xids.of(index)))
        return out

    def convert(self, r: NvmlReading, ts_ns: int) -> GpuSample:
        """NVML units -> exported units (see the module docstring)."""
        energy_j = None
        if r.energy_mj is not None:
            energy_j = self._energy.setdefault(r.uuid, EnergyTotal()).update(r.energy_mj)
        return GpuSample(
            ts_ns=ts_ns, index=r.index, uuid=r.uuid, name=r.name,
            power_w=_scaled(r.power_mw, 1e-3),
            energy_j=energy_j,
            util_gpu=_scaled(r.util_gpu_pct, 0.01),
            util_mem=_scaled(r.util_mem_pct, 0.01),
            mem_used_bytes=r.mem_used_bytes,
            mem_limit_bytes=r.mem_total_bytes,
            sm_clock_mhz=r.sm_clock_mhz,
            temp_c=_scaled(r.temp_c, 1.0),
            power_limit_w=_scaled(r.power_limit_mw, 1e-3),
            clocks_event_reasons=r.clocks_event_reasons,
            pids=r.pids,
        )
