"""A fake NVML backend for demos (``--fake-gpus N``) and tests.

It answers in NVML's own units (mW, mJ, MHz, bytes, %), keeps a true energy counter that
advances by power x elapsed time, and can be told to misbehave the way real GPUs do: a field
not supported (older GPUs), an energy counter that resets or wraps, a GPU that disappears,
and the health faults: Xid events, ECC errors, remapped rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetlens.collector.agent.gpu import GpuLost, NvmlReading
from fleetlens.collector.agent.gpu_health import (
    ECC_AGGREGATE,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    REMAP_KINDS,
    EccKey,
    NvmlHealth,
)

GIB = 1024**3
#: Health readings :meth:`FakeGpuBackend.drop_fields` also takes (unsupported on this GPU).
HEALTH_FIELDS = frozenset({"ecc", "remapped_rows"})
#: An ECC-capable data-center GPU with no error yet.
_NO_ECC = {(kind, counter): 0 for kind in (ECC_CORRECTED, ECC_UNCORRECTED)
           for counter in (ECC_VOLATILE, ECC_AGGREGATE)}
#: NVML clocks event reason bits (nvml.h).
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20


@dataclass
class _FakeGpu:
    index: int
    uuid: str
    name: str
    energy_mj: int = 0
    last_s: float | None = None
    power_mw: int | None = None  # fixed override; None follows the load curve
    pids: tuple[int, ...] = ()
    missing: set[str] = field(default_factory=set)
    lost: bool = False
    ecc: dict[EccKey, int] = field(default_factory=lambda: dict(_NO_ECC))
    remapped_rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REMAP_KINDS, 0))


class FakeGpuBackend:
    """``count`` simulated GPUs; ``clock`` returns seconds (inject one for exact tests)."""

    power_limit_mw = 700_000
    idle_mw = 70_000
    mem_total_bytes = 80 * GIB

    def __init__(self, count: int, clock: Callable[[], float] = time.monotonic,
                 name: str = "NVIDIA H100 80GB HBM3 (fake)", host_seed: str = "") -> None:
        self._clock = clock
        self._xids: list[tuple[int, int]] = []  # pending events, as NVML's event set queues them
        self._gpus = [
            _FakeGpu(index=i, uuid=self._uuid(host_seed, i), name=name,
                     energy_mj=1_000_000_000 + i * 7_000_000)
            for i in range(count)
        ]

    @staticmethod
    def _uuid(seed: str, index: int) -> str:
        # Stable per (host, index) so restarts of a demo keep the same GPU identities.
        digest = hashlib.sha256(seed.encode()).hexdigest()[:8] if seed else "f00dfeed"
        return f"GPU-{digest}-0000-4000-8000-{index:012x}"

    # --- what tests and demos steer -------------------------------------------------------
    def set_power(self, index: int, milliwatts: int | None) -> None:
        """Hold power at ``milliwatts`` (``None``: back to the load curve)."""
        self._gpus[index].power_mw = milliwatts

    def set_energy(self, index: int, millijoules: int) -> None:
        """Set the raw energy counter now (simulates a driver reload or a wrap)."""
        self._gpus[index].energy_mj = millijoules
        self._gpus[index].last_s = self._clock()

    def set_pids(self, index: int, pids: tuple[int, ...]) -> None:
        """Processes NVML reports on this GPU."""
        self._gpus[index].pids = tuple(pids)

    def drop_fields(self, index: int, *names: str) -> None:
        """Make these :class:`NvmlReading` fields unsupported on this GPU."""
        known = {f.name for f in dataclasses.fields(NvmlReading)} | HEALTH_FIELDS
        unknown = set(names) - known
        if unknown:
            raise ValueError(f"unknown reading fields: {sorted(unknown)}")
        self._gpus[index].missing.update(names)

    def lose(self, index: int, lost: bool = True) -> None:
        """Make the GPU stop answering (or come back)."""
        self._gpus[index].lost = lost

    def inject_xid(self, index: int, code: int) -> None:
        """Queue an Xid event (e.g. 79: fallen off the bus, 48: double-bit ECC error)."""
        self._xids.append((index, code))

    def add_ecc_errors(self, index: int, kind: str, count: int = 1) -> None:
        """``count`` more ECC errors of ``kind`` (corrected | uncorrected): both the volatile
        and the aggregate totals grow, as on a real GPU."""
        for counter in (ECC_VOLATILE, ECC_AGGREGATE):
            self._gpus[index].ecc[(kind, counter)] += count

    def set_remapped_rows(self, index: int, **rows: int) -> None:
        """Set remapped-row readings by kind (correctable, uncorrectable, pending, failure)."""
        unknown = set(rows) - set(REMAP_KINDS)
        if unknown:
            raise ValueError(f"unknown remap kinds: {sorted(unknown)}")
        self._gpus[index].remapped_rows.update(rows)

    # --- GpuBackend -----------------------------------------------------------------------
    def device_count(self) -> int:
        return len(self._gpus)

    def close(self) -> None:
        """Nothing to release."""

    def health(self, index: int) -> NvmlHealth:
        gpu = self._gpus[index]
        if gpu.lost:
            raise GpuLost(f"GPU {index}: GPU is lost")
        return NvmlHealth(ecc={} if "ecc" in gpu.missing else dict(gpu.ecc),
                          remapped_rows={} if "remapped_rows" in gpu.missing
                          else dict(gpu.remapped_rows))

    def xid_events(self) -> list[tuple[int, int]]:
        events, self._xids = self._xids, []
        return events

    def read(self, index: int) -> NvmlReading:
        gpu = self._gpus[index]
        if gpu.lost:
            raise GpuLost(f"GPU {index}: GPU is lost")
        now = self._clock()
        load = 0.5 + 0.45 * math.sin(now / 7.0 + index)  # slow, deterministic load curve
        power = gpu.power_mw if gpu.power_mw is not None else int(
            self.idle_mw + load * (self.power_limit_mw - self.idle_mw))
        if gpu.last_s is not None and now > gpu.last_s:
            gpu.energy_mj += int(round(power * (now - gpu.last_s)))  # mW x s = mJ
        gpu.last_s = now
        capped = power >= self.power_limit_mw
        reading = NvmlReading(
            index=index, uuid=gpu.uuid, name=gpu.name,
            power_mw=power,
            energy_mj=gpu.energy_mj,
            util_gpu_pct=int(round(load * 100)),
            util_mem_pct=int(round(load * 60)),
            mem_used_bytes=int(self.mem_total_bytes * (0.2 + 0.7 * load)),
            mem_total_bytes=self.mem_total_bytes,
            sm_clock_mhz=1755 if capped else 1980,
            temp_c=int(35 + 40 * load),
            power_limit_mw=self.power_limit_mw,
            clocks_event_reasons=REASON_SW_POWER_CAP if capped else (
                REASON_GPU_IDLE if load < 0.1 else 0),
            pids=gpu.pids,
        )
        return dataclasses.replace(reading, **{name: None for name in gpu.missing
                                               if name not in HEALTH_FIELDS})
