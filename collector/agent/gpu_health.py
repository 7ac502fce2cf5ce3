"""GPU health: Xid errors, ECC error counts, remapped rows and lost GPUs, in one sample per GPU.

Health moves slowly and NVML's ECC and row-remapping calls are not free, so it is read once per
export interval, not at the 10 Hz of the power and clock sampling. Sources:

- NVML (:class:`~collector.agent.sampler.GpuSampler`): Xid events from NVML's event API
  (drained without waiting), counted here per GPU and code since the agent started; ECC totals
  (corrected/uncorrected x volatile/aggregate) and remapped rows as NVML reports them; a GPU
  that NVML reports lost (or not found) is ``lost``.
- dcgm-exporter (:class:`~collector.agent.dcgm.DcgmSource`): the same ECC and row-remap
  fields from its page (DCGM gives the last Xid code only, not events: ``gpu.xid.last``).

A reading the GPU does not support (no ECC on consumer boards, no row remapping before the
A100) is absent, never zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: ``gpu.ecc.type`` values.
ECC_CORRECTED = "corrected"
ECC_UNCORRECTED = "uncorrected"
#: ``gpu.ecc.counter`` values: since the driver loaded, and over the GPU's life.
ECC_VOLATILE = "volatile"
ECC_AGGREGATE = "aggregate"
#: ``gpu.remap.kind`` values, in ``nvmlDeviceGetRemappedRows``' order.
REMAP_KINDS = ("correctable", "uncorrectable", "pending", "failure")

EccKey = tuple[str, str]  # (ECC_CORRECTED | ECC_UNCORRECTED, ECC_VOLATILE | ECC_AGGREGATE)


@dataclass(frozen=True)
class NvmlHealth:
    """One GPU's health readings in NVML's terms; a missing key is a reading not supported."""

    ecc: dict[EccKey, int] = field(default_factory=dict)
    remapped_rows: dict[str, int] = field(default_factory=dict)  # REMAP_KINDS -> value


@dataclass(frozen=True)
class GpuHealthSample:
    """What the health metrics of one GPU carry at one collection.

    ``uuid`` and ``name`` are the last ones the GPU answered with ("" for a GPU lost before it
    ever answered); ``xid`` is the number of Xid events per code since the agent started;
    ``lost`` is ``None`` where the source cannot tell (dcgm-exporter).
    """

    index: int
    uuid: str
    name: str
    lost: bool | None = False
    xid: dict[int, int] = field(default_factory=dict)
    ecc: dict[EccKey, float] = field(default_factory=dict)
    remapped_rows: dict[str, float] = field(default_factory=dict)


class XidCounts:
    """Xid events counted per (GPU index, code): a cumulative count for ``gpu.xid.errors``
    (NVML's indices do not change while the agent runs)."""

    def __init__(self) -> None:
        self._counts: dict[int, Counter[int]] = {}

    def add(self, index: int, code: int) -> None:
        """Count one event."""
        self._counts.setdefault(index, Counter())[code] += 1

    def of(self, index: int) -> dict[int, int]:
        """Counts per code for one GPU (empty when it had none)."""
        return dict(sorted(self._counts.get(index, Counter()).items()))
