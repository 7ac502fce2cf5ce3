"""Utilisation inversion: measured throughput mapped back to the share of the hardware it uses.

MBU (model bandwidth utilisation) of a window: each decode step reads the weights (split
over the TP group) and the KV cache of every running sequence. Steps per second are what
the window's requests saw (their output tokens - 1 over their decode time) x the share of
the window's engine samples with a request running (no step while the engine idles: without
it, windows at a batch of 0.3-2 on the simulator's fleets read 10-25 points over the
simulator's); the KV read per second is each generated token's context (prompt + half the
output, weighted by output tokens) x the engine's generated tokens per second, so neither
depends on the sampled batch's size. ``MBU = (weights x steps/s x busy share +
kv_bytes_per_token x context x tokens/s) / tp / peak HBM B/s``. MFU of prefill: ``2 x
params x prompt tokens computed per second (those the prefix cache did not serve) per GPU /
peak FLOP/s``. Model shapes and GPU figures come from :mod:`analytics.hardware` (presets
plus ``[analytics]`` ``model_shapes``, ``hbm_gbps`` and ``[analytics.capacity]
peak_tflops``).
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.capacity.points import BUSY, CONTEXT_PER_TOKEN, STEPS_S
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.hardware import hbm_gbps, model_shape, peak_tflops
from fleetlens.pipeline.schema import columns as c

MEMORY, COMPUTE = "memory", "compute"


def _figures(points: pl.DataFrame, config: AnalyticsConfig) -> pl.DataFrame:
    """Per (model, gpu_model): weight bytes, KV bytes per token, params, peak B/s, FLOP/s."""
    rows = []
    for model, gpu in points.select(c.MODEL, c.GPU_MODEL).unique().iter_rows():
        shape = model_shape(model or "", config)
        bw = hbm_gbps(gpu or "", config)
        flops = peak_tflops(gpu or "", config.capacity.peak_tflops)
        rows.append({c.MODEL: model, c.GPU_MODEL: gpu,
                     "_weights": shape.weight_bytes if shape else None,
                     "_kv_bytes": float(shape.kv_bytes_per_token) if shape else None,
                     "_params": shape.params_b * 1e9 if shape else None,
                     "_bw": bw * 1e9 if bw else None,
                     "_flops": flops * 1e12 if flops else None})
    schema = {c.MODEL: pl.String, c.GPU_MODEL: pl.String, "_weights": pl.Float64,
              "_kv_bytes": pl.Float64, "_params": pl.Float64, "_bw": pl.Float64,
              "_flops": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def with_utilisation(points: pl.LazyFrame, config: AnalyticsConfig) -> pl.LazyFrame:
    """Stage: capacity_windows -> the same rows with ``mbu`` and ``mfu`` (null where the
    model's shape or the GPU's figures are unknown, or nothing was decoded)."""
    keys = points.select(c.MODEL, c.GPU_MODEL).unique().collect()
    figures = _figures(keys, config).lazy()
    tp = pl.col(c.TP).cast(pl.Float64)
    steps_s = pl.col(STEPS_S) * pl.col(BUSY).fill_null(1.0)
    bytes_s = (pl.col("_weights") * steps_s + pl.col("_kv_bytes")
               * pl.col(CONTEXT_PER_TOKEN) * pl.col(c.OUTPUT_TOK_S_PER_GPU) * tp) / tp
    return (points.join(figures, on=[c.MODEL, c.GPU_MODEL], how="left")
            .with_columns((bytes_s / pl.col("_bw")).alias(c.MBU),
                          (2.0 * pl.col("_params") * pl.col(c.PROMPT_TOK_S_PER_GPU)
                           / pl.col("_flops")).alias(c.MFU))
            .drop("_weights", "_kv_bytes", "_params", "_bw", "_flops"))


def verdict(mbu: float | None, mfu: float | None, ratio: float) -> tuple[str | None,
                                                                          float | None]:
    """(bound, roofline gap): ``compute`` when MFU >= ratio x MBU else ``memory``; the gap
    is 1 - the utilisation of the nearer roof."""
    if mbu is None and mfu is None:
        return None, None
    m, f = mbu or 0.0, mfu or 0.0
    bound = COMPUTE if f >= ratio * m and f > 0 else MEMORY
    return bound, max(0.0, 1.0 - max(m, f))
