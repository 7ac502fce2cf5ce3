"""config_change incidents: engines restarted with changed settings, then rolled back.

``set = {max_num_seqs = 2}`` (one or more of :data:`~simulator.engine_config.SETTINGS`) on a
service's engines (all of them, those of one host, or the one on a GPU). At the start each
targeted engine is restarted with the new settings, at the end with its own again (the
rollback), both the same way: a quick restart that takes no simulated time. The requests the
engine held are lost as at an engine_down crash (502 gateway spans ending at the restart;
counted in ``RunResult.failed``); the new process serves from the same instant with a new
start time, empty KV and prefix caches, counters from 0, and its new ``fleetlens.engine.config``
(fingerprint, JSON, version). The settings change what the engine does: ``max_num_seqs``
bounds the batch, ``max_num_batched_tokens`` the step's tokens, ``step_overhead_ms`` the CPU
time per step, ``kv_blocks`` / ``prefix_caching`` the cache, ``max_model_len`` which prompts
are refused; ``version`` alone changes only what is reported.

Overlapping changes of one engine apply in the scenario's order. An engine down (engine_down,
host_down, gpu_fault) when its configuration changes takes the new one when it restarts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetlens.pipeline.schema.causes import Cause
from fleetlens.simulator.engine import Instance
from fleetlens.simulator.engine_config import apply, changed, parse_set
from fleetlens.simulator.kvcache import BlockPool
from fleetlens.simulator.roofline import StepModel
from fleetlens.simulator.scenario import Deployment, Incident, ScenarioError

if TYPE_CHECKING:
    from fleetlens.simulator.incidents import Targets


def check(x: Incident, t: Targets, where: str) -> None:
    """Refuse a ``set`` outside config_change, and a config_change without a service, without
    an engine, with a bad ``set`` or one that changes nothing."""
    kind = Cause(x.kind)
    if kind is not Cause.CONFIG_CHANGE:
        if x.set is not None:
            raise ScenarioError(f"{where}.set: only a config_change takes 'set'")
        return
    if not x.service:
        raise ScenarioError(f"{where}: config_change needs a 'service' (a deployment's "
                            "settings change), with 'host' or 'gpu' to pick its engines")
    settings = parse_set(x.set, where)
    if not t.instances:
        raise ScenarioError(f"{where}: no engine runs on the target")
    inst = t.instances[0]
    if apply(inst.deployment, settings) == inst.deployment:
        raise ScenarioError(f"{where}.set: {settings} changes nothing of {x.service}")


def configure(inst: Instance, d: Deployment, kv_blocks: int) -> None:
    """Give a (re)starting engine the settings of ``d``: a new process, so empty caches.
    ``kv_blocks`` is the engine's own block count where ``d`` derives it."""
    inst.deployment = d
    inst.max_seqs, inst.budget = d.max_num_seqs, d.max_num_batched_tokens
    inst.pool = BlockPool(d.kv_blocks or kv_blocks, d.prefix_caching)
    inst.steps = StepModel(d.model, inst.gpus[0].spec, d.tp, d.mfu, d.bandwidth_efficiency,
                           d.step_overhead_ms / 1000.0)


class ConfigChanges:
    """Each engine's own configuration, and the one the active config changes want."""

    def __init__(self, instances: list[Instance]) -> None:
        self.base = {inst.id: inst.deployment for inst in instances}
        self.blocks = {inst.id: inst.pool.total for inst in instances}

    def wanted(self, incidents: list[tuple[Incident, Targets]]) -> dict[str, Deployment]:
        """Instance id -> the configuration it runs under the active changes (only the
        engines whose configuration differs from their own)."""
        out: dict[str, Deployment] = {}
        for x, targets in incidents:
            if x.kind != Cause.CONFIG_CHANGE:
                continue
            settings = parse_set(x.set, "")
            for inst in targets.instances:
                out[inst.id] = apply(out.get(inst.id, self.base[inst.id]), settings)
        return out

    def describe(self, x: Incident, t: Targets) -> list[str]:
        """The ground truth's ``changes`` of a config_change: "name old -> new"."""
        inst = t.instances[0]
        return changed(self.base[inst.id], self.blocks[inst.id], parse_set(x.set, ""))
