"""Failure incidents (issue 30): dead, hung and failing engines, lost hosts, silent agents.

Mechanism per kind (the telemetry contract of docs/simulator.md):

- engine_down: the instance dies at the start. Its pending, waiting and running requests are
  lost (a gateway request gets a 502 gateway span ending at the crash); requests routed to it
  while it is down are refused (503, about 1 ms after the client's request; without a gateway
  the client saw a refusal and nothing is emitted). The agent reports only ``up = 0``; the
  GPUs idle with their memory freed. At the end the engine restarts: a new start time, empty
  KV and prefix caches, counters from 0 (a new process).
- engine_hang: the instance takes no step; its /metrics still answers (running unchanged,
  waiting grows). The gateway answers 504 to each gateway request that has waited
  ``gateway_timeout_s`` while the engine hangs. At the end the requests still there proceed.
- request_errors: a share (magnitude) of the requests routed to the target is aborted by the
  engine after its prefill (finish reason ``abort``, status ERROR; 500 at the gateway).
  With ``gateway_failover`` on its workload, the gateway routes a request to a live peer
  instead once the engine's health check has failed for ``gateway_health_delay_s``.
- host_down: every instance of the host is down as above and the host's agent sends nothing.
- telemetry_gap: the host's agent sends nothing; its engines serve as usual.
- gpu_fault: the GPU is lost (Xid 79, :mod:`simulator.gpu_fault`); its engines are down as
  at an engine_down and restart at the end.
- config_change: the targeted engines restart with changed settings, and again with their
  own at the end (:mod:`simulator.config_change`).

All of it costs a run without failure incidents one truthiness check per request routed and
one attribute check per engine loop turn (``Instance.stalled``).
"""

from __future__ import annotations

import random
from itertools import chain
from typing import TYPE_CHECKING

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import Cause, subject
from fleetlens.simulator import gpu_fault
from fleetlens.simulator.config_change import ConfigChanges, configure
from fleetlens.simulator.engine import Instance
from fleetlens.simulator.gpu_fault import GpuFaults
from fleetlens.simulator.scenario import Deployment, Incident, Scenario, ScenarioError
from fleetlens.simulator.telemetry import SpanRecord, gateway_record, llm_request_record
from fleetlens.simulator.workload import Request

if TYPE_CHECKING:
    from fleetlens.simulator.incidents import Targets

FAILURE_KINDS = frozenset({Cause.ENGINE_DOWN, Cause.ENGINE_HANG, Cause.REQUEST_ERRORS,
                           Cause.HOST_DOWN, Cause.TELEMETRY_GAP, Cause.GPU_FAULT,
                           Cause.CONFIG_CHANGE})
#: kinds that take a whole host (``host`` only)
HOST_KINDS = frozenset({Cause.HOST_DOWN, Cause.TELEMETRY_GAP})
#: kinds whose instances are dead during the window and restart at its end
DOWN_KINDS = frozenset({Cause.ENGINE_DOWN, Cause.HOST_DOWN, Cause.GPU_FAULT})
#: how long the ground truth's engine_restart item lasts (cold caches after a restart)
RESTART_WINDOW_S = 60.0
#: a refused connection reaches the gateway this long after the client's request
REFUSED_S = 0.001
#: HTTP status of a gateway request: lost at a crash, refused, timed out, failed by the engine
BAD_GATEWAY, UNAVAILABLE, GATEWAY_TIMEOUT, SERVER_ERROR = 502, 503, 504, 500
#: vLLM writes finish reasons as a JSON list in a string (pipeline/normalize.py reads both)
ABORTED = '["abort"]'
_NS = 1_000_000_000


def check(x: Incident, t: Targets, where: str) -> None:
    """Refuse a failure incident that could not show anything (or has no single meaning)."""
    kind = Cause(x.kind)
    gpu_fault.check(x, t, where)
    if kind in HOST_KINDS and (x.service or x.gpu >= 0 or not x.host):
        raise ScenarioError(f"{where}: {kind} takes a whole host: give 'host' only")
    if kind in (Cause.ENGINE_DOWN, Cause.ENGINE_HANG) and not x.host:
        raise ScenarioError(f"{where}: {kind} needs a 'host' (or 'gpu') target, with "
                            "'service' to pick that service's engines on it")
    if kind in (Cause.ENGINE_DOWN, Cause.ENGINE_HANG, Cause.REQUEST_ERRORS) \
            and not t.instances:
        raise ScenarioError(f"{where}: no engine runs on the target")
    if kind is Cause.REQUEST_ERRORS:
        if not 0.0 < x.magnitude <= 1.0:
            raise ScenarioError(f"{where}.magnitude: the share of failing requests must be "
                                f"within (0, 1], got {x.magnitude}")
        if not t.streams_of_instances:
            raise ScenarioError(f"{where}: no workload sends requests to the target")


def failure_subject(x: Incident, t: Targets) -> str:
    """The ground truth's subject of a failure incident: the one instance, else the host,
    else the service; the GPU of a gpu_fault."""
    kind = Cause(x.kind)
    if kind is Cause.GPU_FAULT:
        return subject(c.GPU_UUID, t.gpus[0].uuid)
    if kind not in HOST_KINDS and x.host and len(t.instances) == 1:
        return subject(c.INSTANCE_ID, t.instances[0].id)
    if x.host:
        return subject(c.HOST_NAME, x.host)
    return subject(c.SERVICE_NAME, x.service)


def restart_items(x: Incident, t: Targets, item: dict) -> list[dict]:
    """Ground-truth engine_restart items that follow a down incident: the engine_down's own
    subject; for a host_down or gpu_fault, one per host whose engines came back together
    (``host_name=...``, as one restart of several engines of a host is reported), or the
    engine's own (``instance_id=...``) where it was alone."""
    kind = Cause(x.kind)
    if kind not in DOWN_KINDS or not t.instances:
        return []
    start = item[c.END_NS]
    window = {c.START_NS: start, c.END_NS: start + round(RESTART_WINDOW_S * _NS)}
    base = {**item, "cause": Cause.ENGINE_RESTART.value, **window, "magnitude": None}
    if kind is Cause.ENGINE_DOWN:
        return [base]
    by_host: dict[str, list[Instance]] = {}
    for inst in t.instances:
        by_host.setdefault(inst.host, []).append(inst)
    items = []
    for host, group in sorted(by_host.items()):
        services = sorted({inst.deployment.service for inst in group})
        items.append({
            **base, "subject": (subject(c.INSTANCE_ID, group[0].id) if len(group) == 1
                                else subject(c.HOST_NAME, host)),
            c.SERVICE_NAME: services[0] if len(services) == 1 else None,
            "hosts": [host], "instances": sorted(inst.id for inst in group),
            "gpus": sorted(g.uuid for inst in group for g in inst.gpus)})
    return items


def set_process_starts(instances: list[Instance], start_ns: int, seed: int) -> None:
    """Each engine's process started some random minutes before the fleet's start (its own
    generator: the simulation's draws do not change)."""
    for inst in instances:
        minutes = random.Random(f"{seed}:{inst.id}:process-start").uniform(5.0, 600.0)
        inst.process_start_s = start_ns / _NS - 60.0 * minutes


def error_gateway_record(r: Request, inst: Instance, start_ns: int, code: int,
                         end_ns: int) -> SpanRecord:
    """A gateway span that failed with HTTP ``code`` at ``end_ns`` (status ERROR; OTel HTTP
    semconv: ``error.type`` is the status code as a string)."""
    attributes = {a.GEN_AI_REQUEST_MODEL: inst.deployment.model.name,
                  a.SERVER_ADDRESS: inst.host, a.FLEETLENS_INSTANCE_ID: inst.id,
                  a.HTTP_RESPONSE_STATUS_CODE: code, a.ERROR_TYPE: str(code)}
    return (r.gateway, r.trace, r.gateway_span_id, 0, a.GATEWAY_SPAN, r.client_ns,
            max(end_ns, r.client_ns), attributes, f"HTTP {code}")


def failed_records(r: Request, inst: Instance, start_ns: int) -> list[SpanRecord]:
    """Spans of a finished request that failed (``r.status``): an aborted one, or one the
    gateway already answered 504 (its engine span only)."""
    engine = llm_request_record(r, inst.id, start_ns)
    if r.status != SERVER_ERROR:
        return [engine]
    engine[7][a.GEN_AI_FINISH_REASONS] = ABORTED
    records = [(*engine, "aborted")]
    if r.gateway_span_id:
        ok = gateway_record(r, r.gateway, start_ns, inst.deployment.model.name, inst.host,
                            inst.id)
        records.append(error_gateway_record(r, inst, start_ns, SERVER_ERROR, ok[6]))
    return records


class Failures:
    """The failure incidents in effect, applied to the fleet's engines and agents."""

    def __init__(self, scenario: Scenario, instances: list[Instance]) -> None:
        self.start_ns = scenario.start_ns
        self.instances = instances
        self.timeout_s = {w.service: w.gateway_timeout_s for w in scenario.workloads}
        #: service -> how long the gateway's health check of an engine fails before it
        #: routes around the engine (workloads with gateway_failover only)
        self.failover_s = {w.service: w.gateway_health_delay_s for w in scenario.workloads
                           if w.gateway_failover}
        self.active = False  # any failure in effect (the fast path checks only this)
        self.hung: list[Instance] = []
        self.abort: dict[str, float] = {}  # instance id -> share of requests aborted
        self.silent: frozenset[str] = frozenset()  # hosts whose agent sends nothing
        self.records: list[SpanRecord] = []  # error spans not yet exported
        self.failed = 0  # requests that failed (lost, refused, timed out, aborted)
        self._memory: dict[int, float] = {}  # id(GPU) -> memory held before the crash
        self.configs = ConfigChanges(instances)
        self.gpu_faults = GpuFaults()

    def update(self, t: float, incidents: list[tuple[Incident, Targets]]) -> None:
        """Apply the failure incidents active at ``t`` (crashes and restarts happen here)."""
        down, hung, silent = set(), set(), set()
        abort: dict[str, float] = {}
        lost = []
        for x, targets in incidents:
            kind = Cause(x.kind)
            ids = {inst.id for inst in targets.instances}
            if kind in DOWN_KINDS:
                down |= ids
            if kind in HOST_KINDS:
                silent.add(x.host)
            if kind is Cause.ENGINE_HANG:
                hung |= ids
            if kind is Cause.GPU_FAULT:
                lost += targets.gpus
            if kind is Cause.REQUEST_ERRORS:
                for iid in ids:
                    abort[iid] = max(abort.get(iid, 0.0), x.magnitude)
        self.gpu_faults.update(lost)
        configs = self.configs.wanted(incidents)
        for inst in self.instances:
            want = configs.get(inst.id, self.configs.base[inst.id])
            if inst.id in down and not inst.down:
                self._crash(inst, t)
            elif inst.down and inst.id not in down:
                self._restart(inst, t, want)
            elif not inst.down and want != inst.deployment:  # a config change: quick restart
                self._crash(inst, t)
                self._restart(inst, t, want)
            inst.hung = inst.id in hung and not inst.down
            inst.stalled = inst.down or inst.hung
        self.hung = [inst for inst in self.instances if inst.hung]
        self.abort, self.silent = abort, frozenset(silent)
        self.active = bool(down or hung or abort or silent)

    def route(self, r: Request, inst: Instance, peers: list[Instance]) -> Instance | None:
        """At routing: the engine that takes ``r`` (``inst``, or with gateway failover a live
        peer once ``inst`` has failed its health check long enough), None when it is refused
        (down). Marks a request that the engine will abort after its prefill."""
        if inst.down:
            inst = self._failover(r, inst, peers)
        if inst.down:
            self.failed += 1
            if r.gateway_span_id:
                r.status = UNAVAILABLE
                self.records.append(error_gateway_record(
                    r, inst, self.start_ns, UNAVAILABLE, r.client_ns + round(REFUSED_S * _NS)))
            return None
        share = self.abort.get(inst.id)
        # the span id is a uniform random draw already made: no draw of the run changes
        if share and (r.span & 0xFFFFFFFF) / 2**32 < share:
            r.status = SERVER_ERROR
            r.out_target = 1  # the engine finishes it at its first token: the abort
            self.failed += 1
        return inst

    def _failover(self, r: Request, inst: Instance, peers: list[Instance]) -> Instance:
        """A live peer for a gateway request to a dead engine, chosen with the request's own
        routing draw (``r.instance``, uniform), when the gateway has seen the engine fail long
        enough; else ``inst``."""
        delay = self.failover_s.get(r.service)
        if delay is None or not r.gateway_span_id:
            return inst
        if (r.client_ns - self.start_ns) / _NS - inst.down_since < delay:
            return inst
        alive = [peer for peer in peers if not peer.down]
        if not alive:
            return inst
        # where the draw fell within the dead engine's share: its load spreads evenly
        u = r.instance * len(peers)
        return alive[min(int((u - int(u)) * len(alive)), len(alive) - 1)]

    def tick(self, t1: float) -> None:
        """The gateway gives up (504) on requests to a hung engine after its timeout."""
        for inst in self.hung:
            for r in chain(inst.pending, inst.waiting, inst.running):
                if not r.gateway_span_id or r.status:
                    continue
                deadline_ns = r.client_ns + round(self.timeout_s[r.service] * _NS)
                if deadline_ns <= self.start_ns + round(t1 * _NS):
                    r.status = GATEWAY_TIMEOUT
                    self.failed += 1
                    self.records.append(error_gateway_record(
                        r, inst, self.start_ns, GATEWAY_TIMEOUT, deadline_ns))

    def _crash(self, inst: Instance, t: float) -> None:
        crash_ns = self.start_ns + round(t * _NS)
        for r in chain(inst.pending, inst.waiting, inst.running):
            self.failed += 1
            if r.gateway_span_id and not r.status:
                self.records.append(error_gateway_record(r, inst, self.start_ns, BAD_GATEWAY,
                                                         crash_ns))
        inst.pending.clear()
        inst.waiting.clear()
        inst.running.clear()
        inst.prefilling = inst.blocked = False
        inst.down, inst.down_since = True, t
        for g in inst.gpus:  # the process is gone, and its memory with it
            self._memory[id(g)] = g.memory_used_bytes
            g.memory_used_bytes = 0.0

    def _restart(self, inst: Instance, t: float, config: Deployment) -> None:
        """A new process with ``config``: new start time, empty caches, counters from 0."""
        inst.down = False
        inst.process_start_s = (self.start_ns + round(t * _NS)) / _NS
        configure(inst, config, self.configs.blocks[inst.id])
        inst.preemptions = inst.prefix_queries = inst.prefix_hits = 0
        inst.prompt_tokens = inst.generation_tokens = 0
        for g in inst.gpus:
            g.memory_used_bytes = self._memory.pop(id(g), g.memory_used_bytes)
