"""An engine's configuration: what the agent reports of it, and what a config_change may set.

The agent (``collector/agent/liveness.py``) reports ``fleetlens.engine.config`` = 1 with the
configuration as one sorted-keys JSON object (``cache_config``: the labels of vLLM's
``vllm:cache_config_info``, all strings; ``models``: served model id -> ``max_model_len``;
``version``), its fingerprint (the first 16 hex digits of the JSON's SHA-256) and the version.
The simulator cannot import the agent (the import rules), so the same JSON is built here.

vLLM's cache labels do not carry the scheduler's settings; the simulated engine adds
``max_num_seqs``, ``max_num_batched_tokens``, ``tensor_parallel_size`` and
``step_overhead_ms`` to them, so that every change a config_change can make changes the
fingerprint (a real fleet would see those only through a version or start-time change).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator.scenario import Deployment, ScenarioError
from fleetlens.simulator.specs import BLOCK_TOKENS

#: the agent's fingerprint: this many hex digits of the JSON's SHA-256
FINGERPRINT_DIGITS = 16

#: setting -> (type, minimum): what a config_change's ``set`` may change. ``tp`` and
#: ``gpu_memory_utilization`` are not among them: they would move the engine's GPUs or memory.
SETTINGS: dict[str, tuple[type, float | None]] = {
    "max_num_seqs": (int, 1), "max_num_batched_tokens": (int, 16), "max_model_len": (int, 2),
    "kv_blocks": (int, 1), "prefix_caching": (bool, None), "step_overhead_ms": (float, 0.0),
    "version": (str, None),
}


def config_json(d: Deployment, kv_blocks: int) -> str:
    """The configuration JSON of an engine of ``d`` with ``kv_blocks`` KV blocks, as the
    agent builds it (sorted keys, no spaces; label values as vLLM writes them)."""
    cache = {
        "block_size": str(BLOCK_TOKENS), "cache_dtype": "auto",
        "enable_prefix_caching": str(d.prefix_caching),
        "gpu_memory_utilization": str(d.gpu_memory_utilization),
        "num_gpu_blocks": str(kv_blocks), "num_cpu_blocks": "None",
        # the simulated engine's own settings (module docstring)
        "max_num_seqs": str(d.max_num_seqs),
        "max_num_batched_tokens": str(d.max_num_batched_tokens),
        "tensor_parallel_size": str(d.tp), "step_overhead_ms": str(d.step_overhead_ms),
    }
    parts = {"cache_config": cache, "models": {d.model.name: d.max_model_len},
             "version": d.version}
    return json.dumps(parts, sort_keys=True, separators=(",", ":"))


def config_attributes(d: Deployment, kv_blocks: int) -> dict[str, str]:
    """The fingerprint, JSON and version attributes of ``fleetlens.engine.config``."""
    text = config_json(d, kv_blocks)
    digest = hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_DIGITS]
    return {a.ENGINE_CONFIG_FINGERPRINT: digest, a.ENGINE_CONFIG_JSON: text,
            a.ENGINE_VERSION: d.version}


def parse_set(raw: Any, where: str) -> dict[str, Any]:
    """A config_change's ``set`` table as {setting: value} of the setting's type.

    Raises:
        ScenarioError: no table, an empty one, an unknown setting or a bad value.
    """
    if raw is None:
        raise ScenarioError(f"{where}: config_change needs 'set', a table of the settings "
                            f"that change (e.g. set = {{max_num_seqs = 2}}); settings: "
                            f"{sorted(SETTINGS)}")
    items = dict(raw) if isinstance(raw, dict | tuple | list) else None
    if not items:
        raise ScenarioError(f"{where}.set: expected a non-empty table, got {raw!r}")
    out: dict[str, Any] = {}
    for name, value in items.items():
        if name not in SETTINGS:
            raise ScenarioError(f"{where}.set: unknown setting {name!r}; settings a "
                                f"config_change may set: {sorted(SETTINGS)}")
        kind, low = SETTINGS[name]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if kind is str:
            ok = ok and bool(value.strip())
        if not ok or (low is not None and value < low):
            need = {int: "an integer", float: "a number", bool: "true/false",
                    str: "a non-empty string"}[kind]
            bound = f" >= {low}" if low is not None else ""
            raise ScenarioError(f"{where}.set.{name}: expected {need}{bound}, got {value!r}")
        out[name] = float(value) if kind is float else value
    return out


def changed(d: Deployment, kv_blocks: int, settings: dict[str, Any]) -> list[str]:
    """The ground truth's ``changes``: "name old -> new" for each setting (the engine's
    effective KV blocks where the deployment derives them)."""
    old = {name: getattr(d, name) for name in settings}
    if "kv_blocks" in old and not old["kv_blocks"]:
        old["kv_blocks"] = kv_blocks
    return [f"{name} {old[name]} -> {value}" for name, value in settings.items()]


def apply(d: Deployment, settings: dict[str, Any]) -> Deployment:
    """``d`` with ``settings`` in place."""
    return replace(d, **settings)
