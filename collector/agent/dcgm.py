"""NVIDIA dcgm-exporter as the GPU source (``fleetlens agent --dcgm URL``).

Fleets that already run dcgm-exporter need not give the agent NVML too: the agent scrapes the
exporter's ``/metrics`` and turns each GPU's series into the same :class:`GpuSample` the NVML
sampler makes, so the same ``hw.*`` / ``gpu.*`` metrics go out.

Fields (``attributes.DCGM_*``) and their conversions: power W as is; total energy mJ since
boot -> the same never-decreasing J total as NVML's counter (:class:`EnergyTotal`); GPU and
memory-copy utilisation % -> 0..1; framebuffer used MiB -> bytes, its size = total, else
used + free + reserved; temperature C, SM clock MHz and the clocks event (throttle) reasons
bitmask as is; the enforced (else management) power limit W. ``DCGM_FI_PROF_*`` ratios go out
as ``gpu.prof.<field>`` and ``DCGM_FI_DEV_XID_ERRORS`` (the last XID code) as ``gpu.xid.last``.
Health (:meth:`DcgmSource.health`): the ECC totals (SBE = corrected, DBE = uncorrected, volatile
and aggregate) as ``gpu.ecc.errors`` and the row-remap fields as ``gpu.remapped_rows``.

Labels: ``UUID`` (hw.id), ``gpu`` (index), ``modelName`` (model), and ``namespace``/``pod``:
the pods using each GPU, for the instance -> GPU mapping (``[[agent.vllm]] pod``).

DCGM writes a "blank" for a field the GPU does not support (``9223372036854775794`` and the
like for integers, ``140737488355328`` for doubles); a blank is no value, never a number.
"""

from __future__ import annotations

import http.client
import logging
import time
import urllib.error
from collections import defaultdict
from collections.abc import Callable

from fleetlens.collector.agent.gpu_health import (
    ECC_AGGREGATE,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    GpuHealthSample,
)
from fleetlens.collector.agent.prometheus import ExpositionError, parse_samples
from fleetlens.collector.agent.sampler import EnergyTotal, GpuSample
from fleetlens.collector.agent.scraper import fetch_text
from fleetlens.pipeline.schema import attributes as a

log = logging.getLogger(__name__)
#: DCGM_FP64_BLANK (2**47): every DCGM blank, integer or double, is at least this large.
DCGM_BLANK = 140737488355328.0
MIB = 1024 * 1024
#: The profiling fields dcgm-exporter's dcp-metrics-included.csv lists (ratios 0..1, except
#: the PCIe/NVLink byte rates), forwarded when present.
PROF_FIELDS: dict[str, tuple[str, str]] = {
    "GR_ENGINE_ACTIVE": ("1", "graphics engine active ratio"),
    "SM_ACTIVE": ("1", "ratio of cycles an SM has at least one warp"),
    "SM_OCCUPANCY": ("1", "ratio of resident warps to the SM maximum"),
    "PIPE_TENSOR_ACTIVE": ("1", "tensor pipe active ratio"),
    "DRAM_ACTIVE": ("1", "device memory interface active ratio"),
    "PIPE_FP64_ACTIVE": ("1", "fp64 pipe active ratio"),
    "PIPE_FP32_ACTIVE": ("1", "fp32 pipe active ratio"),
    "PIPE_FP16_ACTIVE": ("1", "fp16 pipe active ratio"),
    "PCIE_TX_BYTES": ("By/s", "PCIe transmit rate"),
    "PCIE_RX_BYTES": ("By/s", "PCIe receive rate"),
    "NVLINK_TX_BYTES": ("By/s", "NVLink transmit rate"),
    "NVLINK_RX_BYTES": ("By/s", "NVLink receive rate"),
}


def prof_metric(field: str) -> str:
    """The metric a ``DCGM_FI_PROF_<FIELD>`` goes out as: ``gpu.prof.<field>``."""
    return a.GPU_PROF_PREFIX + field.lower()


#: (name, unit, description) of the gauges read from :attr:`GpuSample.extra`.
EXTRA_GAUGES: tuple[tuple[str, str, str], ...] = (
    (a.GPU_XID_LAST, "1", "last XID error code (dcgm-exporter DCGM_FI_DEV_XID_ERRORS), 0 = none"),
    *((prof_metric(f), unit, f"{text} (DCGM_FI_PROF_{f})")
      for f, (unit, text) in PROF_FIELDS.items()),
)


#: DCGM field -> (gpu.ecc.type, gpu.ecc.counter): single-bit errors are the corrected ones.
ECC_FIELDS = {
    a.DCGM_ECC_SBE_VOL_TOTAL: (ECC_CORRECTED, ECC_VOLATILE),
    a.DCGM_ECC_DBE_VOL_TOTAL: (ECC_UNCORRECTED, ECC_VOLATILE),
    a.DCGM_ECC_SBE_AGG_TOTAL: (ECC_CORRECTED, ECC_AGGREGATE),
    a.DCGM_ECC_DBE_AGG_TOTAL: (ECC_UNCORRECTED, ECC_AGGREGATE),
}
#: DCGM field -> gpu.remap.kind.
REMAP_FIELDS = {
    a.DCGM_CORRECTABLE_REMAPPED_ROWS: "correctable",
    a.DCGM_UNCORRECTABLE_REMAPPED_ROWS: "uncorrectable",
    a.DCGM_ROW_REMAP_PENDING: "pending",
    a.DCGM_ROW_REMAP_FAILURE: "failure",
}


def _health(index: int, uuid: str, name: str, f: dict[str, float]) -> GpuHealthSample:
    """The ECC and row-remap fields present; DCGM says nothing of lost GPUs or Xid counts."""
    return GpuHealthSample(
        index, uuid, name, lost=None,
        ecc={key: f[field] for field, key in ECC_FIELDS.items() if field in f},
        remapped_rows={kind: f[field] for field, kind in REMAP_FIELDS.items() if field in f})


def _first(fields: dict[str, float], *names: str) -> float | None:
    return next((fields[n] for n in names if n in fields), None)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _mem_total_mib(f: dict[str, float]) -> float | None:
    if a.DCGM_FB_TOTAL in f:
        return f[a.DCGM_FB_TOTAL]
    if a.DCGM_FB_USED in f and a.DCGM_FB_FREE in f:
        return f[a.DCGM_FB_USED] + f[a.DCGM_FB_FREE] + f.get(a.DCGM_FB_RESERVED, 0.0)
    return None


def _pods(labels: dict[str, str]) -> str | None:
    pod = labels.get(a.DCGM_POD_LABEL, "")
    namespace = labels.get(a.DCGM_NAMESPACE_LABEL, "")
    return (f"{namespace}/{pod}" if namespace else pod) if pod else None


def dcgm_samples(text: str, ts_ns: int, energy: dict[str, EnergyTotal]) -> list[GpuSample]:
    """One :class:`GpuSample` per GPU (``UUID`` label) in a dcgm-exporter body, by index.

    Args:
        text: the exporter's Prometheus exposition.
        ts_ns: scrape time.
        energy: the energy totals per UUID, kept across scrapes by the caller.
    """
    fields: dict[str, dict[str, float]] = defaultdict(dict)
    labels: dict[str, dict[str, str]] = {}
    pods: dict[str, set[str]] = defaultdict(set)
    for sample in parse_samples(text):
        uuid = sample.labels.get(a.DCGM_UUID_LABEL)
        if not uuid or not sample.name.startswith(a.DCGM_FIELD_PREFIX):
            continue
        labels.setdefault(uuid, sample.labels)
        if (pod := _pods(sample.labels)) is not None:
            pods[uuid].add(pod)
        # One series per (GPU, pod) when pods share a GPU: the GPU's value is the same.
        if sample.value < DCGM_BLANK and sample.value == sample.value:  # not blank, not NaN
            fields[uuid].setdefault(sample.name, sample.value)
    out = [_sample(uuid, labels[uuid], fields[uuid], tuple(sorted(pods[uuid])), ts_ns, energy)
           for uuid in labels]
    return sorted(out, key=lambda s: (s.index, s.uuid))


def _sample(uuid: str, labels: dict[str, str], f: dict[str, float], pods: tuple[str, ...],
            ts_ns: int, energy: dict[str, EnergyTotal]) -> GpuSample:
    energy_j = None
    if a.DCGM_TOTAL_ENERGY in f:
        energy_j = energy.setdefault(uuid, EnergyTotal()).update(int(f[a.DCGM_TOTAL_ENERGY]))
    index = labels.get(a.DCGM_GPU_LABEL, "")
    extra = {prof_metric(name.removeprefix(a.DCGM_PROF_PREFIX)): value
             for name, value in f.items() if name.startswith(a.DCGM_PROF_PREFIX)
             and name.removeprefix(a.DCGM_PROF_PREFIX) in PROF_FIELDS}
    if a.DCGM_XID_ERRORS in f:
        extra[a.GPU_XID_LAST] = f[a.DCGM_XID_ERRORS]
    used_mib, total_mib = f.get(a.DCGM_FB_USED), _mem_total_mib(f)
    gpu_index, name = int(index) if index.isdigit() else -1, labels.get(a.DCGM_MODEL_LABEL, "")
    return GpuSample(
        ts_ns=ts_ns, index=gpu_index, uuid=uuid, name=name,
        power_w=f.get(a.DCGM_POWER_USAGE),
        energy_j=energy_j,
        util_gpu=_scaled(f.get(a.DCGM_GPU_UTIL), 0.01),
        util_mem=_scaled(f.get(a.DCGM_MEM_COPY_UTIL), 0.01),
        mem_used_bytes=_int(_scaled(used_mib, MIB)),
        mem_limit_bytes=_int(_scaled(total_mib, MIB)),
        sm_clock_mhz=_int(f.get(a.DCGM_SM_CLOCK)),
        temp_c=f.get(a.DCGM_GPU_TEMP),
        power_limit_w=_first(f, *a.DCGM_POWER_LIMIT),
        clocks_event_reasons=_int(_first(f, *a.DCGM_CLOCKS_EVENT_REASONS)),
        pids=(), pods=pods, extra=extra, health=_health(gpu_index, uuid, name, f),
    )


class DcgmSource:
    """Scrapes one dcgm-exporter; stands in for the NVML sampler (``sample()``, ``close()``).

    A failing exporter is logged when it starts failing and when it recovers, and gives no
    sample meanwhile (never zeros).
    """

    def __init__(self, url: str, timeout_s: float = 2.0,
                 clock_ns: Callable[[], int] = time.time_ns,
                 fetch: Callable[[str, float], str] = fetch_text) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._clock_ns = clock_ns
        self._fetch = fetch
        self._energy: dict[str, EnergyTotal] = {}
        self.failing = False
        self._last: list[GpuSample] = []

    def sample(self) -> list[GpuSample]:
        """The exporter's GPUs now; ``[]`` when it cannot be read."""
        ts_ns = self._clock_ns()
        try:
            samples = dcgm_samples(self._fetch(self.url, self.timeout_s), ts_ns, self._energy)
        except (OSError, urllib.error.URLError, http.client.HTTPException,
                ExpositionError) as exc:
            if not self.failing:
                log.warning("dcgm-exporter %s: scrape failed: %s", self.url, exc)
                self.failing = True
            self._last = []
            return []
        if self.failing:
            log.warning("dcgm-exporter %s: scraping again", self.url)
            self.failing = False
        self._last = samples
        return samples

    def health(self) -> list[GpuHealthSample]:
        """ECC and row-remap readings of the last scrape (none while the exporter fails)."""
        return [s.health for s in self._last if s.health is not None]

    def close(self) -> None:
        """Nothing to release (the agent calls it at shutdown, as for NVML)."""

