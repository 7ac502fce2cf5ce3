"""The fleet: hosts, GPUs, engine instances and workload streams, built from a scenario."""

from __future__ import annotations

import hashlib
from collections import defaultdict

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator.arrivals import Stream
from fleetlens.simulator.engine import Instance
from fleetlens.simulator.failures import set_process_starts
from fleetlens.simulator.incidents import Injector
from fleetlens.simulator.metrics import agent_resource
from fleetlens.simulator.power import GpuState
from fleetlens.simulator.scenario import Deployment, Host, Scenario, ScenarioError
from fleetlens.simulator.specs import BLOCK_TOKENS
from fleetlens.simulator.workload import Request

#: memory vLLM keeps for activations and CUDA graphs per GPU, bytes
ACTIVATION_RESERVE = 2.0e9
#: one-way network latency between gateway and engine, seconds
BASE_NETWORK_S = 0.0005


def gpu_uuid(scenario: str, host: str, index: int) -> str:
    """A stable NVML-style UUID (``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``)."""
    h = hashlib.sha1(f"{scenario}/{host}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def kv_blocks(d: Deployment, host: Host) -> int:
    """KV blocks of one instance: what the group's memory holds after the weights."""
    if d.kv_blocks:
        return d.kv_blocks
    free = (host.gpu.memory_gb * 1e9 * d.gpu_memory_utilization - ACTIVATION_RESERVE) * d.tp
    free -= d.model.weight_bytes
    blocks = int(free // (d.model.kv_bytes_per_token * BLOCK_TOKENS))
    if blocks < 1:
        raise ScenarioError(f"[[deployment]] {d.service}: {d.model.name} does not fit on "
                            f"{d.tp} x {host.gpu.name}")
    return blocks


class Fleet:
    """Every simulated object of a scenario, wired together."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.gpus: list[GpuState] = []
        self.host_gpus: dict[str, list[GpuState]] = {}
        for host in scenario.hosts:
            gpus = [GpuState(host.gpu, host.name, i, gpu_uuid(scenario.name, host.name, i))
                    for i in range(host.gpus)]
            self.host_gpus[host.name] = gpus
            self.gpus += gpus
        self.instances: list[Instance] = []
        self.host_instances: dict[str, list[Instance]] = defaultdict(list)
        self.routes: dict[str, list[Instance]] = defaultdict(list)
        self.resources: dict[str, dict[str, str]] = {}  # instance id -> resource attributes
        self._place()
        set_process_starts(self.instances, scenario.start_ns, seed)
        self.streams = [Stream(w, i, seed, scenario.start_ns, scenario.duration_s,
                               scenario.base_dir) for i, w in enumerate(scenario.workloads)]
        for s in self.streams:
            if not self.routes[s.w.service]:
                raise ScenarioError(f"[[workload]] {s.w.service}: the service has no instance")
        self.gateways = {w.gateway_service: {
            a.SERVICE_NAME: w.gateway_service, a.HOST_NAME: f"{w.gateway_service}-01"}
            for w in scenario.workloads}
        self.agents = {h.name: agent_resource(h.name, h.dims) for h in scenario.hosts}
        self.injector = Injector(scenario, self.streams, self.instances, self.gpus)
        self.rejected = 0

    def _place(self) -> None:
        """Give each deployment's instances consecutive free GPUs on its hosts."""
        sc = self.scenario
        cursor = {h.name: 0 for h in sc.hosts}
        for d in sc.deployments:
            for host_name in d.hosts:
                host = sc.host(host_name)
                free = host.gpus - cursor[host_name]
                count = d.instances_per_host or free // d.tp
                if count < 1 or count * d.tp > free:
                    raise ScenarioError(f"[[deployment]] {d.service}: host {host_name} has "
                                        f"{free} free GPUs, needs {max(count, 1) * d.tp}")
                blocks = kv_blocks(d, host)
                for k in range(count):
                    first = cursor[host_name]
                    gpus = self.host_gpus[host_name][first:first + d.tp]
                    cursor[host_name] += d.tp
                    for g in gpus:
                        g.memory_used_bytes = host.gpu.memory_gb * 1e9 * d.gpu_memory_utilization
                    iid = f"{host_name}/{d.service}" + (f"/{k}" if count > 1 else "")
                    inst = Instance(iid, d, host_name, gpus, blocks, sc.start_ns)
                    self.instances.append(inst)
                    self.host_instances[host_name].append(inst)
                    self.routes[d.service].append(inst)
                    pid = int(hashlib.sha1(iid.encode()).hexdigest()[:5], 16)
                    self.resources[iid] = {
                        **host.dims, a.SERVICE_NAME: d.service, a.HOST_NAME: host_name,
                        a.SERVICE_INSTANCE_ID: iid, a.RESOURCE_MODEL_KEYS[0]: d.model.name,
                        a.VLLM_PROCESS_ID: str(pid),
                        a.VLLM_INSTRUMENTING_MODULE: "vllm.llm_engine",
                    }

    def arrive(self, t0: float, t1: float) -> int:
        """Create the requests of [t0, t1) and route each to an instance; returns how many."""
        routed: dict[str, list[Request]] = defaultdict(list)
        by_id = {}
        count = 0
        net_delay = self.injector.net_delay
        failures = self.injector.failures
        failing = failures.active
        for stream in self.streams:
            targets = self.routes[stream.w.service]
            for r in stream.until(t0, t1):
                inst = targets[min(int(r.instance * len(targets)), len(targets) - 1)]
                if failing:
                    inst = failures.route(r, inst, targets)
                    if inst is None:
                        continue  # a dead engine refused the connection
                d = inst.deployment
                if r.prompt_len >= d.max_model_len or \
                        -(-r.prompt_len // BLOCK_TOKENS) >= inst.pool.total:
                    self.rejected += 1  # vLLM answers 400 and emits no span
                    continue
                r.out_target = min(r.out_target, d.max_model_len - r.prompt_len)
                r.instance = inst
                if r.gateway_span_id:
                    r.net_s = BASE_NETWORK_S + net_delay.get(inst.id, 0.0)
                r.engine_ns = r.client_ns + round(r.net_s * 1e9)
                routed[inst.id].append(r)
                by_id[inst.id] = inst
                count += 1
        for iid, requests in routed.items():
            by_id[iid].enqueue(requests)
        return count

    def idle(self) -> bool:
        """True when no request is anywhere in the fleet."""
        return all(not (i.pending or i.waiting or i.running) for i in self.instances)
