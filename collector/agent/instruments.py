"""The metrics the agent emits: names, units and point attributes (see docs/telemetry.md).

GPU metrics follow the OpenTelemetry hardware conventions (semantic-conventions v1.41.0) with
point attributes ``hw.id`` (GPU UUID), ``hw.name`` and ``hw.model`` (model), ``hw.vendor``,
``hw.type=gpu`` and ``gpu.index``; ``hw.gpu.utilization`` adds ``hw.gpu.task=general``.
Engine metrics carry ``fleetlens.instance_id`` and ``model_name``; the instance -> GPU mapping
is the gauge ``fleetlens.instance.gpus`` = 1 per (``fleetlens.instance_id``, ``hw.id``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fleetlens.collector.agent.export import MetricGroup, Points
from fleetlens.collector.agent.gpu_health import GpuHealthSample
from fleetlens.collector.agent.liveness import EngineStatus
from fleetlens.collector.agent.sampler import GpuSample
from fleetlens.collector.agent.scraper import EngineSample
from fleetlens.pipeline.schema import attributes as a

Getter = Callable[[GpuSample], float | int | None]

#: GPU metric -> (unit, kind, value of a GpuSample, description).
#: kind: gauge | counter | updowncounter (the instrument the conventions name).
GPU_METRICS: dict[str, tuple[str, str, Getter, str]] = {
    a.HW_POWER: ("W", "gauge", lambda s: s.power_w, "GPU power draw (NVML mW / 1000)"),
    a.HW_ENERGY: ("J", "counter", lambda s: s.energy_j,
                  "GPU energy, monotonic (NVML energy counter mJ / 1000, wraps/resets absorbed)"),
    a.HW_GPU_UTILIZATION: ("1", "gauge", lambda s: s.util_gpu,
                           "GPU busy fraction (NVML % / 100)"),
    a.HW_GPU_MEMORY_UTILIZATION: ("1", "gauge", lambda s: s.mem_used_fraction,
                                  "fraction of GPU memory used (used / size)"),
    a.GPU_MEMORY_CONTROLLER_UTILIZATION: ("1", "gauge", lambda s: s.util_mem,
                                          "memory controller busy fraction (NVML % / 100)"),
    a.HW_GPU_MEMORY_USAGE: ("By", "updowncounter", lambda s: s.mem_used_bytes,
                            "GPU memory used"),
    a.HW_GPU_MEMORY_LIMIT: ("By", "updowncounter", lambda s: s.mem_limit_bytes,
                            "GPU memory size"),
    a.HW_TEMPERATURE: ("Cel", "gauge", lambda s: s.temp_c, "GPU core temperature"),
    a.GPU_CLOCK_SM: ("MHz", "gauge", lambda s: s.sm_clock_mhz, "SM clock"),
    a.GPU_POWER_LIMIT: ("W", "gauge", lambda s: s.power_limit_w,
                        "enforced power limit (NVML mW / 1000)"),
    a.GPU_CLOCKS_EVENT_REASONS: ("1", "gauge", lambda s: s.clocks_event_reasons,
                                 "NVML clocks event (throttle) reasons bitmask"),
}

#: Engine metric -> (unit, kind, description).
ENGINE_METRICS: dict[str, tuple[str, str, str]] = {
    a.ENGINE_KV_CACHE_USAGE: ("1", "gauge", "KV-cache usage, 0..1"),
    a.ENGINE_NUM_RUNNING: ("{request}", "gauge", "requests running in the engine"),
    a.ENGINE_NUM_WAITING: ("{request}", "gauge", "requests waiting to be scheduled"),
    a.ENGINE_PREEMPTIONS: ("{preemption}", "counter", "cumulative preemptions"),
    a.ENGINE_PREFIX_CACHE_QUERIES: ("{token}", "counter", "prefix-cache queried tokens"),
    a.ENGINE_PREFIX_CACHE_HITS: ("{token}", "counter", "prefix-cache hit tokens"),
    a.ENGINE_PROMPT_TOKENS: ("{token}", "counter", "prompt tokens processed"),
    a.ENGINE_GENERATION_TOKENS: ("{token}", "counter", "tokens generated"),
    a.ENGINE_KV_CACHE_CAPACITY: ("{token}", "gauge",
                                 "KV-cache capacity: vLLM's num_gpu_blocks x block_size"),
}
#: Finished requests, one series per vLLM ``finished_reason`` (stop, length, abort, error...).
FINISHED_METRIC = (a.ENGINE_REQUESTS_FINISHED, "{request}", "requests finished, by reason")


def gpu_attributes(sample: GpuSample) -> dict[str, str | int]:
    """Point attributes of every GPU metric."""
    return {a.HW_ID: sample.uuid, a.HW_NAME: sample.name, a.HW_MODEL: sample.name,
            a.HW_VENDOR: a.HW_VENDOR_NVIDIA, a.HW_TYPE: a.HW_TYPE_GPU, a.GPU_INDEX: sample.index}


#: Point attributes a metric adds to :func:`gpu_attributes` (NVML's and DCGM's utilisation is
#: the "general" task of the conventions' hw.gpu.task; encoder/decoder are not sampled).
_EXTRA_ATTRIBUTES: dict[str, dict[str, str]] = {
    a.HW_GPU_UTILIZATION: {a.HW_GPU_TASK: a.HW_GPU_TASK_GENERAL},
}


@dataclass
class GpuState:
    """The latest GPU samples, read by the callbacks at collection."""

    samples: list[GpuSample] = field(default_factory=list)
    #: Health readings, only in the collections that read them (once per export interval).
    health: list[GpuHealthSample] = field(default_factory=list)


@dataclass
class EngineState:
    """The latest engine samples and the instance -> GPU UUIDs mapping."""

    samples: list[EngineSample] = field(default_factory=list)
    mapping: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Every target's liveness and configuration after the last scrape round.
    statuses: list[EngineStatus] = field(default_factory=list)


def register_gpu(group: MetricGroup, state: GpuState,
                 extra_gauges: tuple[tuple[str, str, str], ...] = ()) -> None:
    """Create the hw.* / gpu.* instruments on ``group``, and ``extra_gauges`` (name, unit,
    description) read from each sample's ``extra`` (dcgm-exporter's further fields)."""
    for name, (unit, kind, get, description) in GPU_METRICS.items():
        points = _gpu_points(state, get, _EXTRA_ATTRIBUTES.get(name, {}))
        {"counter": group.counter, "updowncounter": group.up_down_counter}.get(
            kind, group.gauge)(name, unit, description, points)
    for name, unit, description in extra_gauges:
        group.gauge(name, unit, description,
                    _gpu_points(state, lambda s, name=name: s.extra.get(name), {}))


def _gpu_points(state: GpuState, get: Getter, extra: dict[str, str]) -> Callable[[], Points]:
    def points() -> Points:
        return [(value, {**gpu_attributes(s), **extra}) for s in state.samples
                if (value := get(s)) is not None]
    return points


def register_engine(group: MetricGroup, state: EngineState) -> None:
    """Create the engine instruments and the instance -> GPU mapping gauge on ``group``."""
    for name, (unit, kind, description) in ENGINE_METRICS.items():
        points = _engine_points(state, name)
        if kind == "counter":
            group.counter(name, unit, description, points)
        else:
            group.gauge(name, unit, description, points)
    name, unit, description = FINISHED_METRIC
    group.counter(name, unit, description, lambda: [
        (count, {a.ENGINE_INSTANCE: s.instance_id, a.ENGINE_MODEL_NAME: s.model_name,
                 a.ENGINE_FINISHED_REASON: reason})
        for s in state.samples for reason, count in sorted(s.finished.items())])
    group.gauge(a.ENGINE_INSTANCE_GPUS, "1", "1 for each GPU serving an instance",
                lambda: [(1, {a.ENGINE_INSTANCE: instance, a.HW_ID: uuid})
                         for instance, uuids in sorted(state.mapping.items()) for uuid in uuids])


def _engine_points(state: EngineState, signal: str) -> Callable[[], Points]:
    def points() -> Points:
        return [(s.values[signal], {a.ENGINE_INSTANCE: s.instance_id,
                                    a.ENGINE_MODEL_NAME: s.model_name})
                for s in state.samples if signal in s.values]
    return points
