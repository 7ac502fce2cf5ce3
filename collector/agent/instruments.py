"""The metrics the agent emits: names, units and point attributes (see docs/telemetry.md).

GPU metrics follow the OpenTelemetry hardware conventions with point attributes ``hw.id``
(GPU UUID), ``hw.name`` (model), ``hw.type=gpu`` and ``gpu.index``. Engine metrics carry
``fleetlens.instance_id`` and ``model_name``; the instance -> GPU mapping is the gauge
``fleetlens.instance.gpus`` = 1 per (``fleetlens.instance_id``, ``hw.id``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fleetlens.collector.agent.export import MetricGroup, Points
from fleetlens.collector.agent.sampler import GpuSample
from fleetlens.collector.agent.scraper import EngineSample
from fleetlens.pipeline.schema import attributes as a

Getter = Callable[[GpuSample], float | int | None]

#: GPU metric -> (unit, kind, value of a GpuSample, description). kind: gauge | counter.
GPU_METRICS: dict[str, tuple[str, str, Getter, str]] = {
    a.HW_POWER: ("W", "gauge", lambda s: s.power_w, "GPU power draw (NVML mW / 1000)"),
    a.HW_ENERGY: ("J", "counter", lambda s: s.energy_j,
                  "GPU energy, monotonic (NVML energy counter mJ / 1000, wraps/resets absorbed)"),
    a.HW_GPU_UTILIZATION: ("1", "gauge", lambda s: s.util_gpu,
                           "GPU busy fraction (NVML % / 100)"),
    a.HW_GPU_MEMORY_UTILIZATION: ("1", "gauge", lambda s: s.util_mem,
                                  "memory controller busy fraction (NVML % / 100)"),
    a.HW_GPU_MEMORY_USAGE: ("By", "gauge", lambda s: s.mem_used_bytes, "GPU memory used"),
    a.HW_GPU_MEMORY_LIMIT: ("By", "gauge", lambda s: s.mem_limit_bytes, "GPU memory total"),
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
}


def gpu_attributes(sample: GpuSample) -> dict[str, str | int]:
    """Point attributes of every GPU metric."""
    return {a.HW_ID: sample.uuid, a.HW_NAME: sample.name, a.HW_TYPE: a.HW_TYPE_GPU,
            a.GPU_INDEX: sample.index}


@dataclass
class GpuState:
    """The latest GPU samples, read by the callbacks at collection."""

    samples: list[GpuSample] = field(default_factory=list)


@dataclass
class EngineState:
    """The latest engine samples and the instance -> GPU UUIDs mapping."""

    samples: list[EngineSample] = field(default_factory=list)
    mapping: dict[str, tuple[str, ...]] = field(default_factory=dict)


def register_gpu(group: MetricGroup, state: GpuState) -> None:
    """Create the hw.* / gpu.* instruments on ``group``."""
    for name, (unit, kind, get, description) in GPU_METRICS.items():
        points = _gpu_points(state, get)
        if kind == "counter":
            group.counter(name, unit, description, points)
        else:
            group.gauge(name, unit, description, points)


def _gpu_points(state: GpuState, get: Getter) -> Callable[[], Points]:
    def points() -> Points:
        return [(value, gpu_attributes(s)) for s in state.samples
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
    group.gauge(a.ENGINE_INSTANCE_GPUS, "1", "1 for each GPU serving an instance",
                lambda: [(1, {a.ENGINE_INSTANCE: instance, a.HW_ID: uuid})
                         for instance, uuids in sorted(state.mapping.items()) for uuid in uuids])


def _engine_points(state: EngineState, signal: str) -> Callable[[], Points]:
    def points() -> Points:
        return [(s.values[signal], {a.ENGINE_INSTANCE: s.instance_id,
                                    a.ENGINE_MODEL_NAME: s.model_name})
                for s in state.samples if signal in s.values]
    return points
