"""The liveness, configuration and health metrics (issue 30; see docs/telemetry.md).

Engine group, at every scrape round: ``fleetlens.engine.up`` (1/0) for every configured target,
``fleetlens.engine.start_time`` and ``fleetlens.engine.config`` for those up, and the agent's
``fleetlens.agent.heartbeat``. GPU group, at the collections that carry a health reading (once
per export interval): ``gpu.xid.errors``, ``gpu.ecc.errors``, ``gpu.remapped_rows``,
``gpu.lost``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fleetlens.collector.agent.export import MetricGroup, Points
from fleetlens.collector.agent.gpu_health import GpuHealthSample
from fleetlens.collector.agent.liveness import EngineStatus
from fleetlens.pipeline.schema import attributes as a

Statuses = Callable[[], list[EngineStatus]]
Health = Callable[[], list[GpuHealthSample]]


def engine_attributes(status: EngineStatus) -> Iterator[dict[str, str | int]]:
    """The point attributes of the other engine metrics: one set per model the engine served
    at its last good scrape; the instance alone before any."""
    if not status.models:
        yield {a.ENGINE_INSTANCE: status.instance_id}
    for model in status.models:
        yield {a.ENGINE_INSTANCE: status.instance_id, a.ENGINE_MODEL_NAME: model}


def register_liveness(group: MetricGroup, statuses: Statuses) -> None:
    """``fleetlens.engine.up``, ``.start_time``, ``.config`` and the agent heartbeat."""
    group.gauge(a.ENGINE_UP, "1", "1 when the last scrape of the engine's /metrics worked, "
                "else 0", lambda: [(int(s.up), attrs) for s in statuses()
                                   for attrs in engine_attributes(s)])
    group.gauge(a.ENGINE_UNRESPONSIVE, "1", "1 when the last scrape of the engine timed out "
                "(it took the connection, never answered), else 0",
                lambda: [(int(s.unresponsive), attrs) for s in statuses()
                         for attrs in engine_attributes(s)])
    group.gauge(a.ENGINE_START_TIME, "s", "engine process start, s since the epoch "
                "(process_start_time_seconds)",
                lambda: [(s.start_time_s, attrs) for s in statuses()
                         if s.start_time_s is not None for attrs in engine_attributes(s)])
    group.gauge(a.ENGINE_CONFIG_INFO, "1", "1 per engine; its configuration in the attributes",
                lambda: [(1, {**attrs, **_config_attributes(s)}) for s in statuses()
                         if s.config is not None for attrs in engine_attributes(s)])
    # Always one point: the agent is alive even when it can scrape or sample nothing.
    group.gauge(a.AGENT_HEARTBEAT, "1", "1 at every collection of the agent",
                lambda: [(1, {})])


def _config_attributes(status: EngineStatus) -> dict[str, str]:
    config = status.config
    assert config is not None  # filtered by the caller
    out = {a.ENGINE_CONFIG_FINGERPRINT: config.fingerprint, a.ENGINE_CONFIG_JSON: config.json}
    if config.version is not None:
        out[a.ENGINE_VERSION] = config.version
    return out


def health_attributes(h: GpuHealthSample) -> dict[str, str | int]:
    """The GPU metrics' attributes; a GPU lost before it ever answered has only its index."""
    out: dict[str, str | int] = {a.HW_VENDOR: a.HW_VENDOR_NVIDIA, a.HW_TYPE: a.HW_TYPE_GPU,
                                 a.GPU_INDEX: h.index}
    if h.uuid:
        out.update({a.HW_ID: h.uuid, a.HW_NAME: h.name, a.HW_MODEL: h.name})
    return out


def register_gpu_health(group: MetricGroup, health: Health) -> None:
    """``gpu.xid.errors``, ``gpu.ecc.errors``, ``gpu.remapped_rows`` and ``gpu.lost``."""
    group.counter(a.GPU_XID_ERRORS, "{error}", "Xid errors per code since the agent started "
                  "(NVML events)", _points(health, lambda h: [
                      (n, {a.GPU_XID_CODE: code}) for code, n in h.xid.items()]))
    group.counter(a.GPU_ECC_ERRORS, "{error}", "ECC errors (NVML/DCGM totals)",
                  _points(health, lambda h: [
                      (n, {a.GPU_ECC_TYPE: kind, a.GPU_ECC_COUNTER: counter})
                      for (kind, counter), n in sorted(h.ecc.items())]))
    group.gauge(a.GPU_REMAPPED_ROWS, "{row}", "remapped rows by kind (pending, failure: 0/1)",
                _points(health, lambda h: [(n, {a.GPU_REMAP_KIND: kind})
                                           for kind, n in h.remapped_rows.items()]))
    group.gauge(a.GPU_LOST, "1", "1 when NVML says the GPU is lost, else 0",
                _points(health, lambda h: [] if h.lost is None else [(int(h.lost), {})]))


def _points(health: Health, values: Callable[[GpuHealthSample], Points]
            ) -> Callable[[], Points]:
    def points() -> Points:
        return [(value, {**health_attributes(h), **extra})
                for h in health() for value, extra in values(h)]
    return points
