"""What the log records' dedup (issue 17) costs where logs are read.

Writes ``--rows`` raw log records (24 hourly segments, 200 hosts; 1 % NCCL warnings, a few
watchdog timeouts, the rest engine INFO lines; half without a sender observed time; 1 % of the
records delivered twice, as an edge resend stores them) and times, median of ``--runs``, each
with and without the dedup (the two alternate):

- ``log_events``: the log signal as analytics reads it (``scan_log_events``) for one host and
  one hour, and for everything;
- the ``log_records`` SQL view (``fleetlens sql``): ``count(*)`` and a count of NCCL lines,
  against a plain ``read_parquet`` view of the same files.

    .venv/bin/python bench/log_dedup.py [--rows 2000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetlens.pipeline import logsignal  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.schema import tables as t  # noqa: E402
from fleetlens.pipeline.storage import DataDir, connect, table_glob  # noqa: E402

T0 = 1_796_083_200_000_000_000  # 2026-12-01T00:00:00Z
HOUR = 3_600_000_000_000
HOSTS = 200
WARN = "gpu-{h}:5776:5902 [{d}] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion " \
       "from peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
TIMEOUT = "[rank{d}]:[E1201 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {d}]" \
          " Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57, OpType=ALLREDUCE," \
          " NumelIn=4096, NumelOut=4096, Timeout(ms)=60000) ran for 60013 milliseconds before " \
          "timing out."
INFO = "INFO 12-01 10:00:00 engine.py:300 Avg prompt throughput: {x} tokens/s, running: {d} reqs"


def records(rows: int, hour: int) -> pl.DataFrame:
    """One hour's raw log rows, 1 % of them stored twice (a second receipt time)."""
    i = pl.col("i")  # a row number over all hours, dropped by the select
    host = (i % HOSTS).cast(pl.String)
    ts = T0 + i * (HOUR // rows)
    kind = i % 1000
    received = ts + 40_000_000
    frame = pl.DataFrame({"i": pl.int_range(hour * rows, (hour + 1) * rows, eager=True)}).select(
        ts.alias(c.TS_NS),
        # half the senders set the observed time; for the others the collector filled it in
        pl.when(i % 2 == 0).then(ts + 1_000).otherwise(received).alias(c.OBSERVED_NS),
        pl.lit(9).alias(c.SEVERITY_NUMBER), pl.lit("INFO").alias(c.SEVERITY_TEXT),
        pl.when(kind < 10).then(pl.format(WARN.replace("{h}", "{}").replace("{d}", "{}"),
                                          host, i % 8))
        .when(kind == 10).then(pl.format(TIMEOUT.replace("{d}", "{}"), i % 8, i % 8))
        .otherwise(pl.format(INFO.replace("{x}", "{}").replace("{d}", "{}"), i, i % 64))
        .alias(c.BODY),
        pl.lit("").alias(c.EVENT_NAME), pl.lit("").alias(c.TRACE_ID),
        pl.lit("").alias(c.SPAN_ID), pl.lit(0).alias(c.FLAGS),
        pl.lit("vllm").alias(c.SERVICE_NAME), pl.format("gpu-{}", host).alias(c.HOST_NAME),
        pl.concat_str(pl.lit('{"host.name": "gpu-'), host,
                      pl.lit('", "service.instance.id": "gpu-'), host,
                      pl.lit('/vllm/0", "service.name": "vllm"}')).alias(c.RESOURCE_ATTRIBUTES),
        pl.lit("").alias(c.SCOPE_NAME), pl.lit("").alias(c.SCOPE_VERSION),
        pl.lit("{}").alias(c.ATTRIBUTES), pl.lit(0).alias(c.DROPPED_ATTRIBUTES_COUNT),
        received.alias(c.RECEIVED_NS),
        (i.hash(17) % 100 == 0).alias("resend"),  # 1 %, whatever the host or the line
    )
    # the copy: received 5 s later; an observed time the collector filled in moves with it
    again = pl.col(c.RECEIVED_NS) + 5_000_000_000
    resent = frame.filter(pl.col("resend")).with_columns(
        pl.when(pl.col(c.OBSERVED_NS) == pl.col(c.RECEIVED_NS)).then(again)
        .otherwise(pl.col(c.OBSERVED_NS)).alias(c.OBSERVED_NS), again.alias(c.RECEIVED_NS))
    schema = t.table(t.LOG_RECORDS).schema
    return pl.concat([frame, resent]).drop("resend").cast(dict(schema))


def write(data: DataDir, rows: int) -> int:
    written = 0
    for hour in range(24):
        frame = records(rows // 24, hour)
        folder = data.table_dir(t.LOG_RECORDS) / "date=2026-12-01" / f"hour={hour:02d}"
        folder.mkdir(parents=True)
        frame.write_parquet(folder / "bench-000000000001.parquet")
        written += frame.height
    return written


def median_s(fn: Callable[[], object], runs: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    dedup = logsignal.dedup_log_records
    with tempfile.TemporaryDirectory() as tmp:
        data = DataDir(Path(tmp) / "data")
        stored = write(data, args.rows)
        print(f"{stored:,} raw log rows ({stored - args.rows // 24 * 24:,} resent copies), "
              f"{sum(f.stat().st_size for f in Path(tmp).rglob('*.parquet')) / 2**20:.0f} MiB")
        hour = pl.col(c.TS_NS).is_between(T0 + 10 * HOUR, T0 + 11 * HOUR, closed="left")
        one = hour & (pl.col(c.HOST_NAME) == "gpu-7")
        glob = table_glob(data, t.LOG_RECORDS)
        for label, query in (("log_events, one host, one hour", one),
                             ("log_events, everything", pl.lit(True))):
            def events(query: pl.Expr = query) -> int:
                return logsignal.scan_log_events(data).filter(query).collect().height
            row = []
            for on in (True, False):
                logsignal.dedup_log_records = dedup if on else (lambda frame: frame.lazy())
                seconds, height = median_s(events, args.runs)
                row.append(f"{'dedup' if on else 'none'} {seconds:.3f} s ({height:,} rows)")
            logsignal.dedup_log_records = dedup
            print(f"{label}: " + "; ".join(row))
        for text in ("select count(*) from {v}",
                    "select count(*) from {v} where body like '%NCCL WARN%'"):
            row = []
            for view in ("dedup", "raw"):
                con = connect(data, tables=[t.LOG_RECORDS])
                con.execute(f"create view raw_logs as select * from read_parquet('{glob}', "
                            "hive_partitioning = true)")
                name = t.LOG_RECORDS if view == "dedup" else "raw_logs"
                query = text.format(v=name)
                seconds, got = median_s(lambda con=con, query=query: con.execute(
                    query).fetchone()[0], args.runs)
                row.append(f"{view} {seconds:.3f} s ({got:,})")
                con.close()
            print(f"{text.format(v='log_records')}: " + "; ".join(row))


if __name__ == "__main__":
    main()
