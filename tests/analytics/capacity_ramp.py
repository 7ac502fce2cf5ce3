"""A hand-made fleet whose decode step time is known: for the capacity tests.

Each window an instance runs a batch ``B`` (a ramp chosen by the test); its decode step takes
``base + per_seq x B + per_kv x B x context`` seconds, so TPOT and the generation counter
follow it, with lognormal noise per request. TTFT is the prefill time plus a queue that grows
once the batch passes ``queue_from`` (0: never). The answer a test checks against is computed
from the same constants (:meth:`Ramp.knee`), never from the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from fleetlens.analytics.attribution import Tables
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic
from tests.analytics.synthetic_windows import windows_from

NS = 1_000_000_000
T0 = 1_767_225_600 * NS
SAMPLE_S = 5


@dataclass(frozen=True)
class Ramp:
    """The fleet's physics and load."""

    #: the batch of each window (every instance); a pair (before, after): the load stepped
    #: from one to the other at the window's middle
    batches: tuple[float | tuple[float, float], ...]
    base_s: float = 0.008
    per_seq_s: float = 0.00004
    per_kv_s: float = 0.0
    context: float = 800.0  # KV tokens per running sequence
    output: int = 150
    prefill_s: float = 0.05
    noise: float = 0.05  # sigma of the lognormal noise on each request's TPOT
    queue_from: float = 0.0
    instances: int = 2
    tp: int = 1
    window_s: int = 60
    kv_capacity: float = 400_000.0
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    seed: int = 0
    #: each GPU draws ``idle_w + per_seq_w x batch`` (0: no power samples)
    idle_w: float = 0.0
    per_seq_w: float = 0.0

    def step_s(self, batch: float) -> float:
        """The decode step time at ``batch``."""
        return self.base_s + (self.per_seq_s + self.per_kv_s * self.context) * batch

    def knee(self, ratio: float = 1.5) -> float:
        """The batch at which TPOT p99 reaches ``ratio`` x its batch-1 value (the lognormal
        noise scales every step alike, so the ratio of p99s is the ratio of step times)."""
        slope = self.per_seq_s + self.per_kv_s * self.context
        return (ratio - 1) * self.step_s(1.0) / slope + 1.0

    def j_per_token(self, batch: float) -> float:
        """Energy per generated token at ``batch``: the instance's power / its tokens/s."""
        return self.tp * (self.idle_w + self.per_seq_w * batch) * self.step_s(batch) / batch

    def rps(self, batch: float) -> float:
        """One instance's arrivals per second at ``batch`` (Little's law)."""
        return batch / (self.prefill_s + (self.output - 1) * self.step_s(batch))


def ramp_tables(ramp: Ramp) -> Tables:
    """The contract tables of ``ramp`` as in-memory :class:`Tables`."""
    rng = np.random.default_rng(ramp.seed)
    reqs, engine, gpus, mapping = [], [], [], []
    for i in range(ramp.instances):
        inst, host = f"chat-h01-{i}", "h01"
        uuids = [f"GPU-{i}-{g}" for g in range(ramp.tp)]
        mapping += [{c.INSTANCE_ID: inst, c.GPU_UUID: u} for u in uuids]
        gen = prompt = 0.0
        for w, level in enumerate(ramp.batches):
            start = T0 + w * ramp.window_s * NS
            halves = level if isinstance(level, tuple) else (level, level)
            samples = ramp.window_s // SAMPLE_S
            for k in range(samples):
                batch = halves[2 * k >= samples]
                gen += batch / ramp.step_s(batch) * SAMPLE_S
                prompt += ramp.rps(batch) * ramp.context * SAMPLE_S
                engine.append({c.TS_NS: start + k * SAMPLE_S * NS, c.HOST_NAME: host,
                               c.INSTANCE_ID: inst, c.MODEL: ramp.model,
                               c.NUM_RUNNING: batch, c.NUM_WAITING: 0.0,
                               c.KV_CACHE_USAGE: batch * ramp.context / ramp.kv_capacity,
                               c.KV_CAPACITY_TOKENS: ramp.kv_capacity,
                               c.GENERATION_TOKENS_TOTAL: gen, c.PROMPT_TOKENS_TOTAL: prompt})
                if ramp.idle_w:
                    gpus += [{c.TS_NS: start + k * SAMPLE_S * NS, c.HOST_NAME: host,
                              c.GPU_UUID: u, c.GPU_MODEL: ramp.gpu_model,
                              c.POWER_W: ramp.idle_w + ramp.per_seq_w * batch} for u in uuids]
            for half, batch in enumerate(halves):
                reqs += _requests(ramp, rng, batch, start + half * ramp.window_s * NS // 2,
                                  f"{i}-{w}-{half}", host, inst)
        if not ramp.idle_w:
            gpus += [{c.TS_NS: T0, c.HOST_NAME: host, c.GPU_UUID: u,
                      c.GPU_MODEL: ramp.gpu_model} for u in uuids]
    return Tables.from_frames(conform(pl.DataFrame(reqs), t.REQUESTS),
                              conform(pl.DataFrame(engine), t.ENGINE_SAMPLES),
                              conform(pl.DataFrame(gpus), t.GPU_SAMPLES),
                              t.table(t.WINDOWS).empty(), pl.DataFrame(mapping))


def _requests(ramp: Ramp, rng: np.random.Generator, batch: float, start: int, prefix: str,
              host: str, inst: str) -> list[dict]:
    """The requests that arrive in half a window at ``batch`` (each decodes at it)."""
    step = ramp.step_s(batch)
    n = rng.poisson(ramp.rps(batch) * ramp.window_s / 2)
    queue = (0.0 if not ramp.queue_from or batch <= ramp.queue_from
             else 0.5 * (batch - ramp.queue_from))
    reqs = []
    for k in range(n):
        tpot = step * rng.lognormal(0.0, ramp.noise)
        ttft = ramp.prefill_s + queue * rng.uniform(0.5, 1.5)
        reqs.append({c.REQUEST_ID: f"{prefix}-{k}", c.SERVICE_NAME: "chat",
                     c.MODEL: ramp.model, c.HOST_NAME: host, c.INSTANCE_ID: inst,
                     c.ARRIVAL_NS: start + int(rng.uniform(0, ramp.window_s / 2) * NS),
                     c.TPOT_S: tpot, c.TTFT_S: ttft, c.PREFILL_S: ramp.prefill_s,
                     c.DECODE_S: tpot * (ramp.output - 1),
                     # a running sequence holds its prompt and half its output
                     c.INPUT_TOKENS: int(ramp.context - ramp.output / 2),
                     c.OUTPUT_TOKENS: ramp.output,
                     c.IS_ERROR: False})
    return reqs


def write_ramp(ramp: Ramp, data_dir: DataDir) -> None:
    """Publish ``ramp``'s tables (and their `windows`) into a data directory, one file per
    table and UTC date, as the pipeline lays them out."""
    tables = ramp_tables(ramp)
    requests, engine = tables.requests.collect(), tables.engine_samples.collect()
    gpus = tables.gpu_samples.collect()
    mapping = conform(tables.instance_gpus.with_columns(
        pl.lit("h01").alias(c.HOST_NAME), pl.lit(ramp.model).alias(c.MODEL),
        pl.lit(T0).alias(c.START_NS),
        pl.lit(int(engine[c.TS_NS].max())).alias(c.END_NS)), t.INSTANCE_GPUS)
    frames = {t.REQUESTS: (requests, c.ARRIVAL_NS), t.ENGINE_SAMPLES: (engine, c.TS_NS),
              t.GPU_SAMPLES: (gpus, c.TS_NS), t.INSTANCE_GPUS: (mapping, c.START_NS),
              t.WINDOWS: (windows_from(requests, engine, gpus, ramp.window_s),
                          c.WINDOW_START_NS)}
    for table, (frame, ts) in frames.items():
        day = pl.from_epoch(pl.col(ts), time_unit="ns").dt.strftime("%Y-%m-%d").alias(c.DATE)
        for (date,), part in frame.with_columns(day).group_by(c.DATE):
            write_parquet_atomic(part.drop(c.DATE),
                                 data_dir.partition_path(table, date=date) / "ramp.parquet")
