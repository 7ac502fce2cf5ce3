"""NVML behind an interface: raw readings in NVML's own units, and the real pynvml backend.

A :class:`GpuBackend` returns :class:`NvmlReading` values exactly as NVML reports them
(power mW, energy mJ since driver load, clocks MHz, memory bytes, utilisation %, temperature
C). Conversion to the exported units happens once, in :mod:`collector.agent.sampler`, so the
fake backend (:mod:`collector.agent.fake_gpu`) exercises the same conversions as a real GPU.

A field the GPU does not support (``NVMLError_NotSupported`` on older GPUs, e.g. the energy
counter before Volta) is ``None``. A GPU that has fallen off the bus raises :class:`GpuLost`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from fleetlens.collector.agent.gpu_health import NvmlHealth
from fleetlens.collector.agent.nvml_health import XidEvents, read_health

T = TypeVar("T")


log = logging.getLogger(__name__)


class GpuLost(RuntimeError):
    """The GPU at this index no longer answers (fell off the bus, reset, removed)."""


class NoGpu(RuntimeError):
    """NVML could not start; the message is NVML's own (e.g. ``NVML Shared Library Not Found``)."""


@dataclass(frozen=True)
class NvmlReading:
    """One GPU read once, in NVML units; ``None`` where the GPU does not support the field."""

    index: int
    uuid: str
    name: str
    power_mw: int | None = None
    energy_mj: int | None = None
    util_gpu_pct: int | None = None
    util_mem_pct: int | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    sm_clock_mhz: int | None = None
    temp_c: int | None = None
    power_limit_mw: int | None = None
    clocks_event_reasons: int | None = None
    pids: tuple[int, ...] = ()


class GpuBackend(Protocol):
    """What the sampler needs from NVML."""

    def device_count(self) -> int:
        """Number of GPUs NVML enumerated at start."""
        ...

    def read(self, index: int) -> NvmlReading:
        """Read every field of one GPU. Raises :class:`GpuLost` when it is gone."""
        ...

    def health(self, index: int) -> NvmlHealth:
        """ECC totals and remapped rows of one GPU. Raises :class:`GpuLost` when it is gone."""
        ...

    def xid_events(self) -> list[tuple[int, int]]:
        """Xid events since the last call, as (GPU index, Xid code); never waits."""
        ...

    def close(self) -> None:
        """Release NVML."""
        ...


class PynvmlBackend:
    """The real backend over nvidia-ml-py (``pynvml``).

    Raises:
        NoGpu: from the constructor when ``nvmlInit`` fails (no driver, no GPU, ...).
    """

    def __init__(self) -> None:
        import pynvml

        self._nv = pynvml
        try:
            pynvml.nvmlInit()
            self._count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:  # the base class: every init failure lands here
            raise NoGpu(str(exc)) from exc
        self._handles: dict[int, object] = {}
        self._reported: set[tuple[int, str, str]] = set()
        self._xid: XidEvents | None = None  # created at the first xid_events()

    def device_count(self) -> int:
        return self._count

    def close(self) -> None:
        if self._xid is not None:
            self._xid.close()
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass  # already shut down or never fully up: nothing left to release

    def _handle(self, index: int) -> object:
        nv = self._nv
        try:
            handle = self._handles.get(index) or nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            raise GpuLost(f"GPU {index}: {exc}") from exc
        self._handles[index] = handle
        return handle

    def read(self, index: int) -> NvmlReading:
        nv = self._nv
        handle = self._handle(index)
        try:
            uuid, name = nv.nvmlDeviceGetUUID(handle), nv.nvmlDeviceGetName(handle)
        except nv.NVMLError as exc:
            self._handles.pop(index, None)
            raise GpuLost(f"GPU {index}: {exc}") from exc
        try:
            return self._fields(index, handle, str(uuid), str(name))
        except GpuLost:
            self._handles.pop(index, None)  # after a reset the GPU gets a new handle
            raise

    def health(self, index: int) -> NvmlHealth:
        handle = self._handle(index)
        try:
            return read_health(self._nv, handle,
                               lambda field, call: self._optional(index, field, call))
        except GpuLost:
            self._handles.pop(index, None)
            raise

    def xid_events(self) -> list[tuple[int, int]]:
        if self._xid is None:  # GPUs that do not answer now are not registered
            handles = {}
            for index in range(self._count):
                try:
                    handles[index] = self._handle(index)
                except GpuLost:
                    continue
            self._xid = XidEvents(self._nv, handles)
        return self._xid.drain()

    def _fields(self, index: int, handle: object, uuid: str, name: str) -> NvmlReading:
        nv = self._nv

        def opt(field: str, call: Callable[[], T]) -> T | None:
            return self._optional(index, field, call)

        util = opt("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(handle))
        mem = opt("memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        procs = opt("processes", lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle)) or []
        return NvmlReading(
            index=index,
            uuid=uuid,
            name=name,
            power_mw=opt("power", lambda: nv.nvmlDeviceGetPowerUsage(handle)),
            energy_mj=opt("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle)),
            util_gpu_pct=None if util is None else int(util.gpu),
            util_mem_pct=None if util is None else int(util.memory),
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            sm_clock_mhz=opt("sm clock", lambda: nv.nvmlDeviceGetClockInfo(handle,
                                                                          nv.NVML_CLOCK_SM)),
            temp_c=opt("temperature", lambda: self._temperature(handle)),
            power_limit_mw=opt("power limit",
                               lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle)),
            clocks_event_reasons=opt("clock event reasons",
                                     lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            pids=tuple(sorted({int(p.pid) for p in procs})),
        )

    def _temperature(self, handle: object) -> int:
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetTemperatureV(handle, nv.NVML_TEMPERATURE_GPU))
        except (nv.NVMLError_FunctionNotFound, nv.NVMLError_NotSupported,
                nv.NVMLError_ArgumentVersionMismatch):
            # drivers before the versioned call
            return int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))

    def _optional(self, index: int, field: str, call: Callable[[], T]) -> T | None:
        """``call()``, or ``None`` when this GPU or driver lacks the field, or the read failed.

        A lost GPU is re-raised as :class:`GpuLost` so the sampler can skip it. A failure
        other than "not supported" (unknown, timeout, reset required, ...) also gives no
        point, and is logged once per GPU, field and kind, so that a gap is explained.
        """
        nv = self._nv
        try:
            return call()
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_GpuNotFound) as exc:
            raise GpuLost(str(exc)) from exc
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            return None  # this GPU or driver does not have it: expected, silent
        except nv.NVMLError as exc:
            key = (index, field, type(exc).__name__)
            if key not in self._reported:
                self._reported.add(key)
                log.warning("GPU %d: reading %s failed (%s); no point until it reads again",
                            index, field, exc)
            return None


def open_nvml() -> GpuBackend:
    """The real NVML backend. Raises :class:`NoGpu` with NVML's message when unavailable."""
    return PynvmlBackend()
