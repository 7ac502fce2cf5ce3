"""Model shapes and GPU figures for KV capacity and memory-bandwidth estimates.

Built-in figures for common models and GPUs (public spec sheets); ``[analytics]``
``model_shapes`` and ``hbm_gbps`` override or extend them. Lookup is by case-insensitive
substring, so ``NVIDIA H100 80GB HBM3`` finds ``h100``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetlens.analytics.config import AnalyticsConfig


@dataclass(frozen=True)
class ModelShape:
    """What decides a model's weight and KV-cache bytes."""

    params_b: float
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes = 2 (K and V) x layers x kv_heads x head_dim x bytes per value."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes


MODELS: dict[str, ModelShape] = {
    "llama-3.1-8b": ModelShape(8.03, 32, 8, 128),
    "llama-3.1-70b": ModelShape(70.6, 80, 8, 128),
    "llama-3.1-405b": ModelShape(405.0, 126, 8, 128),
    "llama-3.2-3b": ModelShape(3.21, 28, 8, 128),
    "qwen2.5-7b": ModelShape(7.6, 28, 4, 128),
    "qwen2.5-32b": ModelShape(32.8, 64, 8, 128),
    "qwen2.5-72b": ModelShape(72.7, 80, 8, 128),
    "mistral-7b": ModelShape(7.2, 32, 8, 128),
}

#: gpu model -> (HBM GB/s, memory GB)
GPUS: dict[str, tuple[float, float]] = {
    "h200": (4800.0, 141.0),
    "h100-pcie": (2000.0, 80.0),
    "h100": (3350.0, 80.0),
    "a100-40": (1555.0, 40.0),
    "a100": (2039.0, 80.0),
    "l40s": (864.0, 48.0),
    "l4": (300.0, 24.0),
    "b200": (8000.0, 192.0),
    "mi300x": (5300.0, 192.0),
}


#: gpu model -> dense BF16 tensor TFLOP/s (public spec sheets; the simulator's presets carry
#: the same figures, which analytics may not import)
TFLOPS: dict[str, float] = {
    "h200": 989.0, "h100-pcie": 756.0, "h100": 989.0, "a100-40": 312.0, "a100": 312.0,
    "l40s": 362.0, "l4": 121.0, "b200": 2250.0, "mi300x": 1307.0,
}


def _find(table: dict, name: str):  # noqa: ANN202 - generic lookup
    key = name.lower()
    if key in table:
        return table[key]
    for candidate in sorted(table, key=len, reverse=True):
        if candidate in key:
            return table[candidate]
    return None


def model_shape(model: str, config: AnalyticsConfig) -> ModelShape | None:
    """The shape of ``model`` from config, else the built-in table, else ``None``."""
    for name, text in config.model_shapes.items():
        if name.lower() == model.lower():
            p, layers, kv, hd, dt = (float(x) for x in str(text).split(","))
            return ModelShape(p, int(layers), int(kv), int(hd), int(dt))
    return _find(MODELS, model)


def hbm_gbps(gpu_model: str, config: AnalyticsConfig) -> float | None:
    """HBM bandwidth (GB/s) of a GPU model."""
    for name, value in config.hbm_gbps.items():
        if name.lower() in gpu_model.lower():
            return float(value)
    found = _find(GPUS, gpu_model)
    return found[0] if found else None


def memory_gb(gpu_model: str) -> float | None:
    """Memory (GB) of a GPU model from the built-in table."""
    found = _find(GPUS, gpu_model)
    return found[1] if found else None


def peak_tflops(gpu_model: str, overrides: dict[str, float] | None = None) -> float | None:
    """Dense BF16 TFLOP/s of a GPU model: ``overrides`` (substring match), else built-in."""
    for name, value in (overrides or {}).items():
        if name.lower() in gpu_model.lower():
            return float(value)
    return _find(TFLOPS, gpu_model)
