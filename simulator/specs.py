"""Hardware and model specifications: GPU presets, model shapes, and the numbers derived
from them (bytes of weights, KV bytes per token, FLOPs per token).

Presets carry published datasheet figures (dense BF16 tensor TFLOP/s, HBM GB/s, memory,
TDP). A scenario names a preset and may override any field.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

#: Tokens per KV-cache block (vLLM's default block size).
BLOCK_TOKENS = 16


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model.

    Attributes:
        name: the model name reported as ``hw.name`` (e.g. ``NVIDIA H100 80GB HBM3``).
        peak_tflops: dense BF16 tensor throughput at the maximum SM clock.
        hbm_gbps: HBM bandwidth, GB/s.
        memory_gb: memory, GB (10^9 bytes).
        tdp_w: default power limit, W.
        idle_w: power with a model loaded and no kernel running, W.
        max_clock_mhz: SM clock under load when nothing limits it.
        idle_clock_mhz: SM clock reported while idle.
        min_clock_mhz: the lowest clock a power or thermal controller may set.
        link_gbps: per-direction GPU-to-GPU bandwidth for tensor-parallel all-reduce, GB/s.
        link_latency_us: latency of one all-reduce, microseconds.
    """

    name: str
    peak_tflops: float
    hbm_gbps: float
    memory_gb: float
    tdp_w: float
    idle_w: float
    max_clock_mhz: float
    idle_clock_mhz: float = 345.0
    min_clock_mhz: float = 600.0
    link_gbps: float = 450.0
    link_latency_us: float = 8.0


GPU_PRESETS: dict[str, GpuSpec] = {
    "H100-SXM": GpuSpec("NVIDIA H100 80GB HBM3", 989.0, 3350.0, 80.0, 700.0, 90.0, 1980.0),
    "H200": GpuSpec("NVIDIA H200", 989.0, 4800.0, 141.0, 700.0, 95.0, 1980.0),
    "A100-80GB": GpuSpec("NVIDIA A100-SXM4-80GB", 312.0, 2039.0, 80.0, 400.0, 60.0, 1410.0,
                         idle_clock_mhz=210.0, min_clock_mhz=500.0, link_gbps=300.0),
    "L40S": GpuSpec("NVIDIA L40S", 362.0, 864.0, 48.0, 350.0, 40.0, 2520.0,
                    idle_clock_mhz=210.0, link_gbps=32.0, link_latency_us=20.0),
    "L4": GpuSpec("NVIDIA L4", 121.0, 300.0, 24.0, 72.0, 16.0, 2040.0,
                  idle_clock_mhz=210.0, min_clock_mhz=400.0, link_gbps=32.0,
                  link_latency_us=20.0),
}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    Attributes:
        name: served model name (``gen_ai.request.model`` and the engine's ``model_name``).
        params: parameter count.
        layers: transformer layers.
        hidden: hidden size.
        heads: attention (query) heads.
        kv_heads: key/value heads (grouped-query attention).
        head_dim: dimension per head.
        dtype_bytes: bytes per weight and per KV value (2 for BF16).
    """

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """2 (K and V) x layers x kv_heads x head_dim x bytes per value."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attn_flops_per_context_token(self) -> float:
        """FLOPs of attention (QK^T and AV) per new token per token of context."""
        return 4.0 * self.layers * self.heads * self.head_dim


MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 32, 8, 128),
    "llama-3.1-70b": ModelSpec("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 64, 8, 128),
    "llama-3.2-3b": ModelSpec("meta-llama/Llama-3.2-3B-Instruct", 3.21e9, 28, 3072, 24, 8, 128),
    "qwen2.5-32b": ModelSpec("Qwen/Qwen2.5-32B-Instruct", 32.8e9, 64, 5120, 40, 8, 128),
}


def from_preset(presets: dict[str, Any], value: Any, cls: type, what: str) -> Any:
    """Resolve a scenario value: a preset name, or a table with optional ``preset`` plus
    overrides of any field.

    Raises:
        ValueError: unknown preset or field, naming ``what``.
    """
    if isinstance(value, str):
        if value not in presets:
            raise ValueError(f"{what}: unknown preset {value!r} (known: {sorted(presets)})")
        return presets[value]
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected a preset name or a table, got {value!r}")
    table = dict(value)
    base_name = table.pop("preset", None)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {unknown} (known: {sorted(names)})")
    if base_name is not None:
        return replace(from_preset(presets, base_name, cls, what), **table)
    missing = [f.name for f in fields(cls) if f.name not in table and f.default is MISSING]
    try:
        return cls(**table)
    except TypeError as exc:
        raise ValueError(f"{what}: {exc} (missing: {missing})") from None
