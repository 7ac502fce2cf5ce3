"""The data an attribution looks at: the incident's requests and samples versus a baseline.

The baseline period is the ``attribution_lookback_s`` before the incident, ending two windows
before its start (the onset is often gradual and would dilute the baseline). Requests are
taken for the whole service/model, not just the incident's host, so a dimension comparison
can tell which host or GPU stands out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from fleetlens.pipeline.logsignal import scan_log_events
from fleetlens.pipeline.schema import FLEET_WIDE, attributes, validate
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

NS = 1_000_000_000


@dataclass
class Tables:
    """Lazy views of the tables attribution reads (data dir or in-memory frames)."""

    requests: pl.LazyFrame
    engine_samples: pl.LazyFrame
    gpu_samples: pl.LazyFrame
    windows: pl.LazyFrame
    #: (instance_id, gpu_uuid) pairs from the agent/simulator mapping gauge; may be empty.
    instance_gpus: pl.DataFrame
    #: the log signal (pipeline.logsignal): NCCL warnings and collective timeouts; optional
    log_events: pl.LazyFrame | None = None
    #: engines' configurations and GPU health readings (analytics.failures); optional
    engine_configs: pl.LazyFrame | None = None
    gpu_health: pl.LazyFrame | None = None
    #: incidents-shaped periods of failures (an engine down, hung or restarting, a host
    #: down, a GPU fault: analytics.failures.outage_periods) that no baseline may include
    outages: pl.DataFrame | None = None

    @classmethod
    def from_frames(cls, requests: pl.DataFrame, engine_samples: pl.DataFrame,
                    gpu_samples: pl.DataFrame, windows: pl.DataFrame,
                    instance_gpus: pl.DataFrame | None = None) -> Tables:
        """Tables over in-memory frames (tests, benchmarks)."""
        mapping = instance_gpus if instance_gpus is not None else empty_mapping()
        return cls(
            validate(requests.lazy(), t.REQUESTS), validate(engine_samples.lazy(),
                                                             t.ENGINE_SAMPLES),
            validate(gpu_samples.lazy(), t.GPU_SAMPLES), validate(windows.lazy(), t.WINDOWS),
            mapping,
        )

    @classmethod
    def from_data_dir(cls, data_dir: DataDir) -> Tables:
        """Tables over a data directory's Parquet files (predicates pushed into the scans)."""
        mapping = (scan(data_dir, t.INSTANCE_GPUS).select(c.INSTANCE_ID, c.GPU_UUID)
                   .filter(pl.col(c.GPU_UUID).is_not_null() & (pl.col(c.GPU_UUID) != ""))
                   .unique().collect().sort(c.INSTANCE_ID, c.GPU_UUID))
        if mapping.is_empty():  # pipeline has not derived it: read the raw gauge
            mapping = instance_gpus_from_raw(scan(data_dir, t.METRIC_POINTS))
        return cls(
            scan(data_dir, t.REQUESTS), scan(data_dir, t.ENGINE_SAMPLES),
            scan(data_dir, t.GPU_SAMPLES), scan(data_dir, t.WINDOWS), mapping,
            scan_log_events(data_dir), scan(data_dir, t.ENGINE_CONFIGS),
            scan(data_dir, t.GPU_HEALTH),
        )


def empty_mapping() -> pl.DataFrame:
    """An (instance_id, gpu_uuid) mapping with no rows."""
    return pl.DataFrame(schema={c.INSTANCE_ID: pl.String, c.GPU_UUID: pl.String})


def _json_key(key: str) -> pl.Expr:
    return pl.col(c.ATTRIBUTES).str.json_path_match(f"$['{key}']")


def instance_gpus_from_raw(metric_points: pl.LazyFrame) -> pl.DataFrame:
    """Instance -> GPU pairs from the ``fleetlens.instance.gpus`` gauge in raw metric points."""
    pairs = (
        metric_points.filter(pl.col(c.METRIC_NAME) == attributes.ENGINE_INSTANCE_GPUS)
        .select(_json_key(attributes.ENGINE_INSTANCE).alias(c.INSTANCE_ID),
                _json_key(attributes.HW_ID).alias(c.GPU_UUID))
        .drop_nulls()
        .filter(pl.col(c.GPU_UUID) != "")
        .unique()
        .collect()
    )
    return pairs.sort(c.INSTANCE_ID, c.GPU_UUID)


@dataclass
class IncidentContext:
    """Everything attribution needs about one incident, collected."""

    incident: dict[str, Any]
    window_s: int
    start_ns: int
    end_ns: int
    base_start_ns: int
    base_end_ns: int
    requests_inc: pl.DataFrame
    requests_base: pl.DataFrame
    engine_inc: pl.DataFrame
    engine_base: pl.DataFrame
    gpu_inc: pl.DataFrame
    gpu_base: pl.DataFrame
    instance_gpus: pl.DataFrame
    #: the scope's log_events rows from the baseline start to the incident end (or None)
    log_events: pl.DataFrame | None = None

    @property
    def host(self) -> str | None:
        """The incident's host, or ``None`` for a service- or fleet-level incident."""
        host = self.incident[c.HOST_NAME]
        return None if host == FLEET_WIDE else host

    @property
    def hosts(self) -> list[str]:
        """Hosts that served the incident's scope in the incident or baseline period."""
        both = pl.concat([self.requests_inc.select(c.HOST_NAME),
                          self.requests_base.select(c.HOST_NAME)])
        return sorted(both[c.HOST_NAME].unique().to_list())

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS

    @property
    def base_duration_s(self) -> float:
        return (self.base_end_ns - self.base_start_ns) / NS


def _scope(frame: pl.LazyFrame, incident: dict[str, Any]) -> pl.LazyFrame:
    for key in (c.SERVICE_NAME, c.MODEL):
        if incident[key] != FLEET_WIDE:
            frame = frame.filter(pl.col(key) == incident[key])
    return frame


def with_gpu(requests: pl.DataFrame, mapping: pl.DataFrame) -> pl.DataFrame:
    """Add ``gpu_uuid`` to requests whose instance runs on exactly one GPU."""
    if c.GPU_UUID in requests.columns or mapping.is_empty():
        return requests
    single = mapping.group_by(c.INSTANCE_ID).agg(pl.col(c.GPU_UUID).first(),
                                                 pl.len().alias("_n"))
    single = single.filter(pl.col("_n") == 1).drop("_n")
    return requests.join(single, on=c.INSTANCE_ID, how="left")


def load_context(tables: Tables, incident: dict[str, Any], window_s: int,
                 lookback_s: int) -> IncidentContext:
    """Collect the incident's and the baseline period's rows from ``tables``."""
    start, end = int(incident[c.START_NS]), int(incident[c.END_NS])
    base_end = start - 2 * window_s * NS
    base_start = base_end - lookback_s * NS
    reqs = _scope(tables.requests, incident).filter(
        pl.col(c.ARRIVAL_NS).is_between(base_start, end, closed="left")).collect()
    reqs = with_gpu(reqs, tables.instance_gpus)
    inc = reqs.filter(pl.col(c.ARRIVAL_NS) >= start)
    base = reqs.filter(pl.col(c.ARRIVAL_NS) < base_end)
    if not base.is_empty():
        # Data may begin inside the lookback: rates are per second of data actually seen.
        step = window_s * NS
        base_start = max(base_start, int(base[c.ARRIVAL_NS].min()) // step * step)
    hosts = reqs[c.HOST_NAME].unique().to_list()
    instances = reqs[c.INSTANCE_ID].unique().to_list()
    gpus = tables.instance_gpus.filter(pl.col(c.INSTANCE_ID).is_in(instances))[c.GPU_UUID]

    def samples(frame: pl.LazyFrame, keep: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
        got = frame.filter(pl.col(c.TS_NS).is_between(base_start, end, closed="left")
                           & keep).collect()
        return (got.filter(pl.col(c.TS_NS) >= start),
                got.filter(pl.col(c.TS_NS) < base_end))

    # Only the scope's own instances and GPUs: a host may serve other models too.
    eng_inc, eng_base = samples(tables.engine_samples,
                                pl.col(c.INSTANCE_ID).is_in(instances))
    on_gpu = pl.col(c.GPU_UUID).is_in(gpus.to_list()) if len(gpus) else pl.col(
        c.HOST_NAME).is_in(hosts)
    gpu_inc, gpu_base = samples(tables.gpu_samples, on_gpu)
    logs = None
    if tables.log_events is not None:  # the scope's engines' log lines (issue 15)
        keep = pl.col(c.HOST_NAME).is_in(hosts)
        if incident[c.SERVICE_NAME] != FLEET_WIDE:
            keep &= pl.col(c.SERVICE_NAME) == incident[c.SERVICE_NAME]
        logs = tables.log_events.filter(
            pl.col(c.TS_NS).is_between(base_start, end, closed="left") & keep).collect()
    return IncidentContext(dict(incident), window_s, start, end, base_start, base_end, inc,
                           base, eng_inc, eng_base, gpu_inc, gpu_base, tables.instance_gpus,
                           logs)
