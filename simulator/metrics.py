"""GPU and engine metrics exactly as the fleetlens agent emits them (docs/telemetry.md).

Per host one resource (``service.name=fleetlens-agent``, ``host.name`` and the host's
dimensions) with scopes: the hw.* / gpu.* metrics with point attributes ``hw.id``,
``hw.name``, ``hw.type=gpu``, ``gpu.index``; and the engine metrics the agent scrapes from
vLLM's ``/metrics`` with ``fleetlens.instance_id`` and ``model_name``, plus the instance -> GPU
mapping gauge, ``up``, the engine's start time and its configuration
(``fleetlens.engine.config``, :mod:`simulator.engine_config`). The GPU scope also carries the
agent's GPU health: ``gpu.lost`` (0/1) for every GPU and ``gpu.xid.errors`` per Xid code seen
so far (:mod:`simulator.gpu_fault`); a lost GPU has no other point, as the agent's sampler
skips it. Counters are cumulative monotonic sums from the fleet's start (back to 0 when an
engine restarts, as a new process's). A third scope carries the agent's heartbeat.

The sampler produces plain data (a :data:`Collection` per host) so that it can cross a process
boundary; :func:`metrics_data` turns collections into the SDK's ``MetricsData``.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator.engine import Instance
from fleetlens.simulator.engine_config import config_attributes
from fleetlens.simulator.power import GpuState

AGENT_SERVICE = "fleetlens-agent"
GPU_SCOPE = "fleetlens.agent.gpu"
ENGINE_SCOPE = "fleetlens.agent.engine"
#: the agent's own liveness (issue 30), apart from what it samples
AGENT_SCOPE = "fleetlens.agent"
_CUMULATIVE = AggregationTemporality.CUMULATIVE

#: name -> (unit, is_counter); units and kinds as the agent's instruments.
GPU_METRICS = {
    a.HW_POWER: ("W", False), a.HW_ENERGY: ("J", True), a.HW_GPU_UTILIZATION: ("1", False),
    a.HW_GPU_MEMORY_UTILIZATION: ("1", False), a.HW_GPU_MEMORY_USAGE: ("By", False),
    a.HW_GPU_MEMORY_LIMIT: ("By", False), a.HW_TEMPERATURE: ("Cel", False),
    a.GPU_CLOCK_SM: ("MHz", False), a.GPU_POWER_LIMIT: ("W", False),
    a.GPU_CLOCKS_EVENT_REASONS: ("1", False),
}
#: the agent's GPU health metrics (collector/agent/health_instruments.py)
HEALTH_METRICS = {a.GPU_XID_ERRORS: ("{error}", True), a.GPU_LOST: ("1", False)}
ENGINE_METRICS = {
    a.ENGINE_KV_CACHE_USAGE: ("1", False), a.ENGINE_NUM_RUNNING: ("{request}", False),
    a.ENGINE_NUM_WAITING: ("{request}", False), a.ENGINE_PREEMPTIONS: ("{preemption}", True),
    a.ENGINE_PREFIX_CACHE_QUERIES: ("{token}", True),
    a.ENGINE_PREFIX_CACHE_HITS: ("{token}", True), a.ENGINE_PROMPT_TOKENS: ("{token}", True),
    a.ENGINE_GENERATION_TOKENS: ("{token}", True),
    a.ENGINE_INSTANCE_GPUS: ("1", False),
    a.ENGINE_UP: ("1", False), a.ENGINE_START_TIME: ("s", False),
    a.ENGINE_CONFIG_INFO: ("1", False),
}
AGENT_METRICS = {a.AGENT_HEARTBEAT: ("1", False)}
_SPECS = {**GPU_METRICS, **HEALTH_METRICS, **ENGINE_METRICS, **AGENT_METRICS}

#: (host, ts_ns, {scope: {metric: [(attributes, value)]}}): one host's collection.
Collection = tuple[str, int, dict[str, dict[str, list[tuple[dict, float]]]]]


def agent_resource(host: str, dims: dict[str, str]) -> dict[str, str]:
    """Attributes of the agent's resource on ``host``."""
    return {**dims, a.SERVICE_NAME: AGENT_SERVICE, a.HOST_NAME: host}


class Sampler:
    """Reads the fleet's state into one agent collection per host at each sample time."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}  # uuid -> (busy_s, mem_busy_s)
        # point attributes built once: the samples of a long run share them
        self._gpu_attrs: dict[str, tuple[dict, dict]] = {}  # uuid -> (usual, health)
        self._configs: dict[str, tuple[object, dict]] = {}  # id -> (deployment, attributes)

    def gpu_values(self, g: GpuState, interval_s: float) -> dict[str, float]:
        """The sampled values of one GPU over the last ``interval_s``."""
        busy0, mem0 = self._last.get(g.uuid, (0.0, 0.0))
        self._last[g.uuid] = (g.busy_s, g.mem_busy_s)
        util = min((g.busy_s - busy0) / interval_s, 1.0)
        return {
            a.HW_POWER: g.last_power_w, a.HW_ENERGY: g.energy_j, a.HW_GPU_UTILIZATION: util,
            a.HW_GPU_MEMORY_UTILIZATION: min((g.mem_busy_s - mem0) / interval_s, 1.0),
            a.HW_GPU_MEMORY_USAGE: g.memory_used_bytes,
            a.HW_GPU_MEMORY_LIMIT: g.spec.memory_gb * 1e9, a.HW_TEMPERATURE: g.temp_c,
            a.GPU_CLOCK_SM: g.clock_mhz(util > 0), a.GPU_POWER_LIMIT: g.power_limit_w,
            a.GPU_CLOCKS_EVENT_REASONS: g.reasons,
        }

    def collect(self, host: str, ts_ns: int, t: float, interval_s: float,
                gpus: list[GpuState], instances: list[Instance]) -> tuple[Collection, int]:
        """One host's collection at ``ts_ns`` (virtual offset ``t``) and its point count."""
        gpu: dict[str, list] = {name: [] for name in (*GPU_METRICS, *HEALTH_METRICS)}
        lost, xids = gpu[a.GPU_LOST], gpu[a.GPU_XID_ERRORS]
        for g in gpus:
            attrs, health = self._attributes(g)
            values = self.gpu_values(g, interval_s)  # read all the same: utilisation windows
            lost.append((health, int(g.lost)))
            for code, count in g.xid.items():  # none before the first Xid, as the agent
                xids.append(({**health, a.GPU_XID_CODE: code}, count))
            if g.lost:  # NVML answers GpuIsLost: the agent skips the GPU's sample
                continue
            for name, value in values.items():
                gpu[name].append((attrs, value))
        scopes = {GPU_SCOPE: gpu, AGENT_SCOPE: {a.AGENT_HEARTBEAT: [({}, 1)]}}
        points = sum(map(len, gpu.values())) + 1
        if instances:
            engine: dict[str, list] = {name: [] for name in ENGINE_METRICS}
            for inst in instances:
                attrs = {a.ENGINE_INSTANCE: inst.id,
                         a.ENGINE_MODEL_NAME: inst.deployment.model.name}
                if inst.down:  # the scrape fails: "up" is all the agent can say
                    engine[a.ENGINE_UP].append((attrs, 0))
                    continue
                for name, value in (
                    (a.ENGINE_UP, 1),
                    (a.ENGINE_START_TIME, inst.process_start_s),
                    (a.ENGINE_KV_CACHE_USAGE, inst.pool.usage),
                    (a.ENGINE_NUM_RUNNING, len(inst.running)),
                    (a.ENGINE_NUM_WAITING, inst.num_waiting(t)),
                    (a.ENGINE_PREEMPTIONS, inst.preemptions),
                    (a.ENGINE_PREFIX_CACHE_QUERIES, inst.prefix_queries),
                    (a.ENGINE_PREFIX_CACHE_HITS, inst.prefix_hits),
                    (a.ENGINE_PROMPT_TOKENS, inst.prompt_tokens),
                    (a.ENGINE_GENERATION_TOKENS, inst.generation_tokens),
                ):
                    engine[name].append((attrs, value))
                engine[a.ENGINE_CONFIG_INFO].append((self._config(inst), 1))
                engine[a.ENGINE_INSTANCE_GPUS] += [
                    ({a.ENGINE_INSTANCE: inst.id, a.HW_ID: g.uuid}, 1) for g in inst.gpus]
            scopes[ENGINE_SCOPE] = engine
            points += sum(len(v) for v in engine.values())
        return (host, ts_ns, scopes), points

    def _attributes(self, g: GpuState) -> tuple[dict, dict]:
        """The GPU's usual point attributes, and those of the agent's health metrics
        (``collector/agent/health_instruments.health_attributes``)."""
        cached = self._gpu_attrs.get(g.uuid)
        if cached is None:
            usual = {a.HW_ID: g.uuid, a.HW_NAME: g.spec.name, a.HW_TYPE: a.HW_TYPE_GPU,
                     a.GPU_INDEX: g.index}
            health = {a.HW_VENDOR: a.HW_VENDOR_NVIDIA, a.HW_TYPE: a.HW_TYPE_GPU,
                      a.GPU_INDEX: g.index, a.HW_ID: g.uuid, a.HW_NAME: g.spec.name,
                      a.HW_MODEL: g.spec.name}
            cached = self._gpu_attrs[g.uuid] = (usual, health)
        return cached

    def _config(self, inst: Instance) -> dict:
        """``fleetlens.engine.config``'s attributes, built again after a config change."""
        cached = self._configs.get(inst.id)
        if cached is None or cached[0] is not inst.deployment:
            d = inst.deployment
            attrs = {a.ENGINE_INSTANCE: inst.id, a.ENGINE_MODEL_NAME: d.model.name,
                     **config_attributes(d, inst.pool.total)}
            cached = self._configs[inst.id] = (d, attrs)
        return cached[1]


def metrics_data(collections: list[Collection], resources: dict[str, Resource],
                 start_ns: int) -> MetricsData:
    """The SDK ``MetricsData`` of per-host collections (``resources`` by host name)."""
    out = []
    for host, ts_ns, scopes in collections:
        scope_metrics = []
        for scope, metrics in scopes.items():
            items = []
            for name, points in metrics.items():
                if not points:  # e.g. no engine metric while every engine is down
                    continue
                unit, counter = _SPECS[name]
                data_points = [NumberDataPoint(attrs, start_ns if counter else 0, ts_ns, value)
                               for attrs, value in points]
                data = Sum(data_points, _CUMULATIVE, True) if counter else Gauge(data_points)
                items.append(Metric(name, "", unit, data))
            scope_metrics.append(ScopeMetrics(InstrumentationScope(scope), items, ""))
        out.append(ResourceMetrics(resources[host], scope_metrics, ""))
    return MetricsData(out)
