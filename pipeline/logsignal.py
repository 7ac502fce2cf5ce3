"""The log signal: NCCL warnings and PyTorch watchdog collective timeouts from ``log_records``.

An inference engine that shards a model over GPUs (tensor parallelism) runs its all-reduces
through NCCL; when the interconnect degrades, two kinds of lines reach its log (and, through
an OTLP log pipeline, the collector's ``raw/logs``):

* NCCL's own warnings, ``<host>:<pid>:<tid> [<cuda device>] [<file>:<line>] NCCL WARN <text>``,
  e.g. ``node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from
  peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)``;
* the PyTorch ``ProcessGroupNCCL`` watchdog's timeout of one collective, e.g. ``[rank1]:[E1201
  ...ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught
  collective operation timeout: WorkNCCL(SeqNum=57, OpType=ALLREDUCE, NumelIn=4096,
  NumelOut=4096, Timeout(ms)=60000) ran for 60013 milliseconds before timing out.``

:func:`log_events` turns such records into ``log_events`` rows (docs/telemetry.md, "Log
formats"); every other record is left out. The raw log volume of an inference fleet is small,
so the table is derived when read (:func:`scan_log_events`) rather than stored.

Delivery is at-least-once (an edge collector resends the batch whose acknowledgement it did
not record; an SDK resends a request whose answer it lost), and a log record has no id, so
:func:`dedup_log_records` recognizes a copy by its content (``tables.LOG_RECORDS`` key) before
anything is counted: a resent NCCL line must not read as two warnings.
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

NCCL_WARN = " NCCL WARN "
WATCHDOG = "Watchdog caught collective operation timeout"
#: host:pid:tid [device] (optional file:line) NCCL WARN message
NCCL_RE = r"^\S+?:\d+:\d+ \[(\d+)\](?: \S+:\d+)? NCCL WARN "
WATCHDOG_RE = (r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+).*?Timeout\(ms\)=(\d+)\) ran for (\d+) "
               r"milliseconds before timing out")
RANK_RE = r"Rank (\d+)\]"


def dedup_log_records(records: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """``log_records`` with one row per record: a copy delivered twice kept once (the first).

    Two rows are one record when every column of the table's key is equal (nulls equal
    nulls), ``observed_ns`` read as null where it equals ``received_ns``: the collector
    filled it in on receipt, so each copy has its own (``tables.LOG_RECORD_KEY_SQL`` is
    the same rule in SQL). Two genuinely identical lines (same time to the nanosecond,
    body, resource and attributes) are kept once too: docs/telemetry.md says when that
    can happen.
    """
    frame = records.lazy()
    present = set(frame.collect_schema().names())  # a frame without a column: all equal
    observed = pl.col(c.OBSERVED_NS)
    if c.RECEIVED_NS in present:
        observed = pl.when(observed == pl.col(c.RECEIVED_NS)).then(None).otherwise(observed)
    key = [observed if name == c.OBSERVED_NS else pl.col(name)
           for name in t.table(t.LOG_RECORDS).key if name in present]
    return frame.filter(pl.struct(key).is_first_distinct()) if key else frame


def log_events(records: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """``log_records`` rows -> ``log_events`` rows (NCCL warnings and collective timeouts),
    one per record however often it was delivered (:func:`dedup_log_records`).

    Timestamps: the record's time, or its observed time where the sender left it 0.
    """
    body = pl.col(c.BODY)
    timeout = body.str.contains(WATCHDOG, literal=True)
    nccl = body.str.contains(NCCL_RE)
    ts = pl.when(pl.col(c.TS_NS) > 0).then(pl.col(c.TS_NS)).otherwise(pl.col(c.OBSERVED_NS))

    def group(pattern: str, index: int) -> pl.Expr:
        return body.str.extract(pattern, index)

    # The filter reads the body only, which is part of the dedup key: deduplicating the few
    # matching rows gives the same rows as deduplicating all of them first.
    frame = dedup_log_records(records.lazy().filter(body.is_not_null() & (timeout | nccl)))
    frame = frame.select(
        ts.alias(c.TS_NS),
        pl.col(c.SERVICE_NAME),
        pl.col(c.HOST_NAME),
        pl.col(c.RESOURCE_ATTRIBUTES).str.json_path_match(
            f"$['{a.SERVICE_INSTANCE_ID}']").alias(c.INSTANCE_ID),
        pl.when(timeout).then(pl.lit(c.LOG_EVENT_COLLECTIVE_TIMEOUT))
        .otherwise(pl.lit(c.LOG_EVENT_NCCL_WARN)).alias(c.LOG_EVENT),
        group(WATCHDOG_RE, 2).alias(c.OP_TYPE),
        group(WATCHDOG_RE, 1).cast(pl.Int64, strict=False).alias(c.SEQ_NUM),
        group(WATCHDOG_RE, 4).cast(pl.Int64, strict=False).alias(c.RAN_MS),
        group(WATCHDOG_RE, 3).cast(pl.Int64, strict=False).alias(c.TIMEOUT_MS),
        group(RANK_RE, 1).cast(pl.Int64, strict=False).alias(c.PG_RANK),
        group(NCCL_RE, 1).cast(pl.Int64, strict=False).alias(c.CUDA_DEVICE),
        body,
    )
    # a watchdog line that names no WorkNCCL(... ran for N) is not a timeout we understand
    frame = frame.filter((pl.col(c.LOG_EVENT) == c.LOG_EVENT_NCCL_WARN)
                         | pl.col(c.RAN_MS).is_not_null())
    return frame.select(pl.col(name).cast(dtype)
                        for name, dtype in t.LOG_EVENTS_TABLE.columns.items())


def scan_log_events(data_dir: DataDir) -> pl.LazyFrame:
    """The ``log_events`` of a data directory's raw logs (lazy: filters are pushed down)."""
    return log_events(scan(data_dir, t.LOG_RECORDS))
