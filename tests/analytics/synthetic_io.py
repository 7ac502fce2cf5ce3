"""Write a synthetic fleet's tables into a data directory, as the pipeline would."""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic
from tests.analytics.synthetic import SynthData


def write_tables(data: SynthData, data_dir: DataDir, name: str = "synthetic.parquet") -> None:
    """Publish requests, windows, engine/GPU samples and the instance-GPU map by UTC date."""
    frames = {
        t.REQUESTS: (data.requests, c.ARRIVAL_NS),
        t.WINDOWS: (data.windows, c.WINDOW_START_NS),
        t.ENGINE_SAMPLES: (data.engine_samples, c.TS_NS),
        t.GPU_SAMPLES: (data.gpu_samples, c.TS_NS),
    }
    start = int(data.gpu_samples[c.TS_NS].min())
    end = int(data.gpu_samples[c.TS_NS].max())
    gpus = data.gpu_samples.select(c.HOST_NAME, c.GPU_UUID).unique()
    mapping = data.instance_gpus.join(gpus, on=c.GPU_UUID).with_columns(
        pl.lit(data.requests[c.MODEL][0]).alias(c.MODEL), pl.lit(start).alias(c.START_NS),
        pl.lit(end).alias(c.END_NS))
    frames[t.INSTANCE_GPUS] = (conform(mapping, t.INSTANCE_GPUS), c.START_NS)
    for table, (frame, ts) in frames.items():
        day = pl.from_epoch(pl.col(ts), time_unit="ns").dt.strftime("%Y-%m-%d").alias(c.DATE)
        for (date,), part in frame.with_columns(day).group_by(c.DATE):
            write_parquet_atomic(part.drop(c.DATE),
                                 data_dir.partition_path(table, date=date) / name)
