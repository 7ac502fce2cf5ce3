"""What the twin of one pool reads: its requests, engines, configuration and GPU samples over
the last hours of the data (the `capacity` row names the pool; `capacity_windows` its
engines)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from fleetlens.analytics.capacity.points import latency_window
from fleetlens.analytics.capacity.stage import POOL
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, has_parquet, scan

NS = 1_000_000_000


@dataclass(frozen=True)
class PoolData:
    """One pool's telemetry over ``[start_ns, end_ns)``."""

    requests: pl.DataFrame  # errors left out, arrival order
    engines: int
    kv_capacity: float | None  # KV tokens one engine holds, as it reports
    configs: pl.DataFrame  # engine_configs rows of its engines
    gpu_samples: pl.DataFrame  # of its GPUs, in the period
    gpus: int
    start_ns: int
    end_ns: int


def _scan(root: DataDir, table: str) -> pl.LazyFrame | None:
    return scan(root, table) if has_parquet(root.table_dir(table)) else None


def pool_data(root: DataDir, row: dict, hours: float) -> PoolData | None:
    """The telemetry of the pool of `capacity` row ``row`` over the last ``hours`` of its
    requests (None when it has none)."""
    # the pool is its (instance, window)s, not its instances: an instance whose
    # configuration changed served two pools, one before and one after
    keys = [c.HOST_NAME, c.INSTANCE_ID, c.WINDOW_START_NS]
    members = (scan(root, t.CAPACITY_WINDOWS)
               .filter(pl.all_horizontal([pl.col(k) == row[k] for k in POOL]))
               .select(keys).unique())
    requests = (scan(root, t.REQUESTS)
                .filter(~pl.col(c.IS_ERROR).fill_null(False))
                .with_columns(latency_window(int(row[c.WINDOW_S])))
                .join(members, on=keys, how="semi").drop(c.WINDOW_START_NS).collect())
    if requests.is_empty():
        return None
    end = int(requests[c.ARRIVAL_NS].max()) + 1
    start = end - int(hours * 3600 * NS)
    requests = requests.filter(pl.col(c.ARRIVAL_NS) >= start).sort(c.ARRIVAL_NS)
    start = int(requests[c.ARRIVAL_NS].min())  # less data than hours: from the first
    engines = requests[c.INSTANCE_ID].unique().to_list()
    engine = _scan(root, t.ENGINE_SAMPLES)
    kv = None
    if engine is not None and c.KV_CAPACITY_TOKENS in engine.collect_schema().names():
        kv = (engine.filter(pl.col(c.INSTANCE_ID).is_in(engines))
              .select(pl.col(c.KV_CAPACITY_TOKENS).max()).collect().item())
    configs = _scan(root, t.ENGINE_CONFIGS)
    configs = (configs.filter(pl.col(c.INSTANCE_ID).is_in(engines)).collect()
               if configs is not None else pl.DataFrame({c.CONFIG_JSON: []}, {c.CONFIG_JSON:
                                                                              pl.String}))
    mapping = _scan(root, t.INSTANCE_GPUS)
    uuids = (mapping.filter(pl.col(c.INSTANCE_ID).is_in(engines)
                            & pl.col(c.GPU_UUID).is_not_null() & (pl.col(c.GPU_UUID) != ""))
             .select(c.GPU_UUID).unique()
             .collect()[c.GPU_UUID].to_list() if mapping is not None else [])
    gpus = (scan(root, t.GPU_SAMPLES).filter(pl.col(c.GPU_UUID).is_in(uuids)
                                             & pl.col(c.TS_NS).is_between(start, end))
            .collect())
    return PoolData(requests, len(engines), float(kv) if kv else None, configs, gpus,
                    len(uuids) or len(engines) * int(row[c.TP] or 1), start, end)


def measured_energy(data: PoolData) -> float | None:
    """The pool's GPU energy over its period, J: each GPU's mean power x the period (None
    without power samples)."""
    power = data.gpu_samples.filter(pl.col(c.POWER_W).is_not_null())
    if power.is_empty():
        return None
    per_gpu = power.group_by(c.GPU_UUID).agg(pl.col(c.POWER_W).mean())[c.POWER_W]
    seconds = (data.end_ns - data.start_ns) / NS
    # a GPU without samples draws what the others do (the mean), not nothing
    return float(per_gpu.mean()) * data.gpus * seconds
