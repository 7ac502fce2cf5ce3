"""Energy per output token at a pool's knee (the leaderboard's "J/token at the knee").

Per engine instance and window, the power its GPUs drew (the mean of each GPU's
`gpu_samples.power_w` in the window, summed over the GPUs `instance_gpus` maps to it) and
the tokens it generated (the engine's generation counter). At the knee, J/token is the
energy over the tokens of the windows just under the knee batch (``[knee x (1 - rel),
knee]``, as goodput's attainment), where the fleet ran there; where it never did (an
extrapolated knee), from the fits: the power a linear fit on the batch gives there x the
fitted decode step time p50 / the batch (each running sequence gets a token per step).
Idle energy is not subtracted: at the knee the GPUs are busy, and what a GPU draws is what
the operator pays for.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from fleetlens.analytics.attribution import Tables
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: private column of the elasticity points: the instance's GPUs' mean power in the window
POWER = "_power_w"


def instance_power(tables: Tables, window_s: int) -> pl.LazyFrame:
    """Per (instance, window): the summed mean power of the instance's GPUs, W (no row for
    an instance without a GPU mapping)."""
    step = window_s * NS
    mapping = tables.instance_gpus.lazy().select(c.INSTANCE_ID, c.GPU_UUID).unique()
    per_gpu = (tables.gpu_samples.filter(pl.col(c.POWER_W).is_not_null())
               .group_by(c.GPU_UUID, (pl.col(c.TS_NS) // step * step).alias(c.WINDOW_START_NS))
               .agg(pl.col(c.POWER_W).mean()))
    return (mapping.join(per_gpu, on=c.GPU_UUID)
            .group_by(c.INSTANCE_ID, c.WINDOW_START_NS)
            .agg(pl.col(c.POWER_W).sum().alias(POWER)))


def j_per_token_at(batch: np.ndarray, power_w: np.ndarray, tok_s: np.ndarray, knee: float,
                   step_s: float, rel: float) -> float | None:
    """J/token at ``knee`` (module docstring) from the windows' batch, instance power (W)
    and generated tokens/s; ``step_s`` is the fitted decode step time p50 at the knee.
    None without any window with power and tokens."""
    # a window without a running batch (no engine sample) has a NaN batch: polyfit over it
    # raised LinAlgError and stopped the whole analytics run
    ok = np.isfinite(batch) & np.isfinite(power_w) & np.isfinite(tok_s) & (tok_s > 0)
    batch, power_w, tok_s = batch[ok], power_w[ok], tok_s[ok]
    if batch.size == 0 or knee <= 0:
        return None
    near = (batch >= knee * (1 - rel)) & (batch <= knee)
    if near.any():
        return float(power_w[near].sum() / tok_s[near].sum())
    if np.unique(batch).size < 2:
        return None
    slope, intercept = np.polyfit(batch, power_w, 1)
    power = intercept + slope * knee if slope > 0 else float(power_w.mean())
    return float(power * step_s / knee)
