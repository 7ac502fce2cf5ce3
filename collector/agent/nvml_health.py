"""GPU health through nvidia-ml-py: ECC totals, remapped rows, and Xid events from NVML's
event API (used by :class:`~collector.agent.gpu.PynvmlBackend`).

Xid events: one event set, every GPU registered for ``nvmlEventTypeXidCriticalError`` (a GPU
or driver that refuses is skipped quietly: no Xid counts for it), drained with
``nvmlEventSetWait_v2(set, 0)`` until NVML answers ``Timeout`` (nothing pending), so the agent
never blocks on it. Each event names its device handle and, in ``eventData``, the Xid code.
NVML queues events only from registration on: Xids from before the agent started are not seen.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fleetlens.collector.agent.gpu_health import (
    ECC_AGGREGATE,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    REMAP_KINDS,
    NvmlHealth,
)

T = TypeVar("T")
#: ``optional(field, call)``: ``call()``, or ``None`` when the reading is not available.
Optional = Callable[[str, Callable[[], T]], T | None]

log = logging.getLogger(__name__)
#: Events taken per drain at most (a storm of Xids must not hold the GPU loop).
MAX_EVENTS_PER_DRAIN = 1000


def read_health(nv: Any, handle: object, optional: Optional) -> NvmlHealth:
    """ECC totals and remapped rows of one GPU; a reading NVML refuses is left out.

    ``optional`` raises :class:`~collector.agent.gpu.GpuLost` when NVML says the GPU is lost.
    """
    ecc = {}
    for kind, error_type in ((ECC_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                             (ECC_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
        for counter, counter_type in ((ECC_VOLATILE, nv.NVML_VOLATILE_ECC),
                                      (ECC_AGGREGATE, nv.NVML_AGGREGATE_ECC)):
            value = optional(f"ECC {kind} {counter}", lambda e=error_type, c=counter_type:
                             nv.nvmlDeviceGetTotalEccErrors(handle, e, c))
            if value is not None:
                ecc[(kind, counter)] = int(value)
    rows = optional("remapped rows", lambda: nv.nvmlDeviceGetRemappedRows(handle))
    remapped = {} if rows is None else dict(zip(REMAP_KINDS, (int(v) for v in rows),
                                                strict=True))
    return NvmlHealth(ecc=ecc, remapped_rows=remapped)


def _handle_key(handle: object) -> object:
    """A device handle's address: NVML hands out one pointer per GPU, but each call wraps it
    in a new ctypes object, so the events' handles are matched by address, not identity."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)  # not a ctypes pointer (a driver stand-in): the object itself


class XidEvents:
    """NVML's event set for Xid critical errors on the GPUs whose handles it is given."""

    def __init__(self, nv: Any, handles: dict[int, object]) -> None:
        self._nv = nv
        self._set: object | None = None
        self._index: dict[object, int] = {}
        self._failed = False
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("NVML events unavailable (%s): no Xid counts", exc)
            return
        for index, handle in sorted(handles.items()):
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._set)
            except nv.NVMLError as exc:  # NotSupported on some boards/drivers: expected
                log.info("GPU %d: Xid events not available (%s)", index, exc)
                continue
            self._index[_handle_key(handle)] = index

    def drain(self) -> list[tuple[int, int]]:
        """The Xid events pending now, as (GPU index, Xid code), without waiting."""
        nv, out = self._nv, []
        while self._set is not None and self._index and len(out) < MAX_EVENTS_PER_DRAIN:
            try:
                data = nv.nvmlEventSetWait_v2(self._set, 0)
            except nv.NVMLError_Timeout:
                break  # nothing pending
            except nv.NVMLError as exc:
                if not self._failed:  # said once: a broken event set would repeat it at 1 Hz
                    log.warning("reading NVML Xid events failed: %s", exc)
                    self._failed = True
                break
            index = self._index.get(_handle_key(data.device))
            if index is not None and data.eventType & nv.nvmlEventTypeXidCriticalError:
                out.append((index, int(data.eventData)))
        return out

    def close(self) -> None:
        """Free the event set."""
        if self._set is not None:
            try:
                self._nv.nvmlEventSetFree(self._set)
            except self._nv.NVMLError:
                pass  # NVML already shut down: nothing left to free
            self._set = None
