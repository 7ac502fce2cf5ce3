"""Injected incidents: each kind changes a mechanism of the model, never an output number.

Mechanism per kind (what ``magnitude`` means):

- traffic_surge: the service's arrival rate x magnitude.
- long_prompts: the service's prompt lengths x magnitude.
- prefix_cache_drop: on a host, the engines' prefix cache is emptied and bypassed; on a
  service, a share (magnitude) of requests carries a per-request prefix (template change).
- kv_cache_pressure: a share (magnitude) of the engines' KV blocks is taken away.
- thermal_throttle: GPU inlet temperature + magnitude C; the thermal controller lowers clocks.
- power_cap: GPU power limit = magnitude x TDP; the power controller lowers clocks.
- slow_gpu: the GPU delivers magnitude x its bandwidth and FLOP/s at a normal clock.
- network_overhead: + magnitude s each way between gateway and engine.
- collective_stall: tensor-parallel all-reduces magnitude x slower.
- engine_overhead: + magnitude s of CPU per engine step and per request in the API server.
- engine_down, engine_hang, request_errors, host_down, telemetry_gap, gpu_fault,
  config_change: failures, see :mod:`simulator.failures` (magnitude: request_errors only).

The ground truth names each incident's ``cause``, ``subject`` and window.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import Cause, subject
from fleetlens.simulator import config_change
from fleetlens.simulator.arrivals import Stream
from fleetlens.simulator.engine import Instance
from fleetlens.simulator.failures import (
    FAILURE_KINDS,
    Failures,
    check,
    failure_subject,
    restart_items,
)
from fleetlens.simulator.power import INLET_C, GpuState
from fleetlens.simulator.scenario import Incident, Scenario, ScenarioError


@dataclass
class Targets:
    """What an incident touches."""

    streams: list[Stream]
    instances: list[Instance]
    gpus: list[GpuState]
    streams_of_instances: list[Stream]  # workloads that send requests to ``instances``


#: kinds whose mechanism lives in the engines (they need an engine on the target)
ENGINE_KINDS = frozenset({Cause.KV_CACHE_PRESSURE, Cause.PREFIX_CACHE_DROP,
                          Cause.NETWORK_OVERHEAD, Cause.COLLECTIVE_STALL,
                          Cause.ENGINE_OVERHEAD})


def _check(x: Incident, t: Targets, where: str) -> None:
    """Refuse an incident that could not show anything (the ground truth would lie)."""
    kind = Cause(x.kind)
    config_change.check(x, t, where)  # 'set' belongs to config_change alone
    if kind in FAILURE_KINDS:
        check(x, t, where)
        return
    if kind in (Cause.TRAFFIC_SURGE, Cause.LONG_PROMPTS) and not t.streams:
        raise ScenarioError(f"{where}: service {x.service!r} has no workload")
    if kind in ENGINE_KINDS and not t.instances:
        raise ScenarioError(f"{where}: no engine runs on the target")
    if kind is Cause.COLLECTIVE_STALL and not any(i.deployment.tp > 1 for i in t.instances):
        raise ScenarioError(f"{where}: no tensor-parallel (tp > 1) engine on the target")
    if kind is Cause.NETWORK_OVERHEAD and not any(
            s.w.gateway_share > 0 for s in t.streams_of_instances):
        raise ScenarioError(f"{where}: no gateway traffic reaches the target "
                            "(set gateway_share on its workload)")
    if kind in (Cause.THERMAL_THROTTLE, Cause.POWER_CAP, Cause.SLOW_GPU) and not t.gpus:
        raise ScenarioError(f"{where}: no GPU matches the target")


class Injector:
    """Applies the incidents active at each tick to the fleet's objects."""

    def __init__(self, scenario: Scenario, streams: list[Stream], instances: list[Instance],
                 gpus: list[GpuState]) -> None:
        self.scenario, self.streams, self.instances, self.gpus = (
            scenario, streams, instances, gpus)
        self.active: tuple[int, ...] = ()
        self.targets = [self._targets(i) for i in scenario.incidents]
        for n, (incident, targets) in enumerate(zip(scenario.incidents, self.targets,
                                                    strict=True)):
            _check(incident, targets, f"[[incident]] #{n + 1} ({incident.kind})")
        #: extra one-way network delay per instance id (network_overhead)
        self.net_delay: dict[str, float] = {}
        self.failures = Failures(scenario, instances)

    def _targets(self, incident: Incident) -> Targets:
        streams = [s for s in self.streams if s.w.service == incident.service]
        instances = [
            inst for inst in self.instances
            if (not incident.host or inst.host == incident.host)
            and (not incident.service or inst.deployment.service == incident.service)
            and (incident.gpu < 0 or any(g.index == incident.gpu for g in inst.gpus))
        ]
        gpus = [g for g in self.gpus
                if (incident.host and g.host == incident.host)
                and (incident.gpu < 0 or g.index == incident.gpu)]
        if incident.service and not incident.host:
            gpus = [g for inst in instances for g in inst.gpus]
        served = {inst.deployment.service for inst in instances}
        return Targets(streams, instances, gpus,
                       [s for s in self.streams if s.w.service in served])

    def update(self, t: float) -> bool:
        """Apply what is active at virtual time ``t``; True when the set changed."""
        active = tuple(i for i, x in enumerate(self.scenario.incidents)
                       if x.start_s <= t < x.end_s)
        if active == self.active:
            return False
        started = set(active) - set(self.active)
        self.active = active
        incidents = self.scenario.incidents
        self.failures.update(t, [(incidents[i], self.targets[i]) for i in active
                                 if incidents[i].kind in FAILURE_KINDS])
        self._reset()
        for i in active:
            self._apply(self.scenario.incidents[i], self.targets[i], i in started)
        for inst in self.instances:
            inst.retune()
        return True

    def _reset(self) -> None:
        for s in self.streams:
            s.rate_multiplier, s.prompt_multiplier, s.prefix_break_share = 1.0, 1.0, 0.0
        for inst in self.instances:
            inst.extra_overhead_s, inst.link_slowdown, inst.prefix_cache_off = 0.0, 1.0, False
            inst.pool.reserved = 0
            inst.blocked = False
        for g in self.gpus:
            g.perf, g.power_limit_w, g.inlet_c = 1.0, g.spec.tdp_w, INLET_C
        self.net_delay = {}

    def _apply(self, x: Incident, t: Targets, started: bool) -> None:
        m, kind = x.magnitude, Cause(x.kind)
        if kind is Cause.TRAFFIC_SURGE:
            for s in t.streams:
                s.rate_multiplier *= m
        elif kind is Cause.LONG_PROMPTS:
            for s in t.streams:
                s.prompt_multiplier *= m
        elif kind is Cause.PREFIX_CACHE_DROP:
            if x.host:
                for inst in t.instances:
                    inst.prefix_cache_off = True
                    if started:
                        inst.pool.evict_all()
            for s in t.streams if not x.host else ():
                s.prefix_break_share = max(s.prefix_break_share, m)
        elif kind is Cause.KV_CACHE_PRESSURE:
            for inst in t.instances:
                inst.pool.reserved = max(inst.pool.reserved, int(inst.pool.total * m))
        elif kind is Cause.THERMAL_THROTTLE:
            for g in t.gpus:
                g.inlet_c += m
        elif kind is Cause.POWER_CAP:
            for g in t.gpus:
                g.power_limit_w = min(g.power_limit_w, g.spec.tdp_w * m)
        elif kind is Cause.SLOW_GPU:
            for g in t.gpus:
                g.perf *= m
        elif kind is Cause.NETWORK_OVERHEAD:
            for inst in t.instances:
                self.net_delay[inst.id] = self.net_delay.get(inst.id, 0.0) + m
        elif kind is Cause.COLLECTIVE_STALL:
            for inst in t.instances:
                inst.link_slowdown *= m
        elif kind is Cause.ENGINE_OVERHEAD:
            for inst in t.instances:
                inst.extra_overhead_s += m

    def ground_truth(self, seed: int) -> dict:
        """Every injected incident with cause, subject and window (ns) (and a config_change's
        ``changes``), then the engine_restart items that follow down incidents, plus seed
        and hash."""
        sc = self.scenario
        items, restarts = [], []
        for x, t in zip(sc.incidents, self.targets, strict=True):
            if x.kind in FAILURE_KINDS:
                subj = failure_subject(x, t)
            elif x.host and x.gpu >= 0:
                subj = subject(c.GPU_UUID, t.gpus[0].uuid)
            elif x.host:
                subj = subject(c.HOST_NAME, x.host)
            else:
                subj = subject(c.SERVICE_NAME, x.service)
            items.append({
                "cause": x.kind, "subject": subj,
                c.START_NS: sc.start_ns + round(x.start_s * 1e9),
                c.END_NS: sc.start_ns + round(x.end_s * 1e9),
                "magnitude": x.magnitude,
                c.SERVICE_NAME: x.service or None,
                c.HOST_NAME: x.host or None,
                c.GPU_UUID: t.gpus[0].uuid if x.gpu >= 0 else None,
                "hosts": sorted({g.host for g in t.gpus} | {i.host for i in t.instances}),
                "instances": sorted(i.id for i in t.instances),
                "gpus": sorted(g.uuid for g in t.gpus),
            })
            if x.kind == Cause.CONFIG_CHANGE:
                items[-1]["changes"] = self.failures.configs.describe(x, t)
            restarts += restart_items(x, t, items[-1])
        # after the injected incidents, so that item n is still incident n of the scenario
        items += restarts
        return {"scenario": sc.name, "scenario_sha256": sc.sha256, "seed": seed,
                c.START_NS: sc.start_ns, c.END_NS: sc.start_ns + round(sc.duration_s * 1e9),
                "incidents": items}
