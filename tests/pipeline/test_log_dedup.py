"""The log records' dedup key (issue 17): what counts as a second copy of one record, and
what stays two records. The Polars rule (pipeline.logsignal) and the SQL view's rule
(tables.LOG_RECORD_KEY_SQL, the ``log_records`` view of ``fleetlens sql``) agree."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetlens.pipeline.logsignal import dedup_log_records, log_events
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from fleetlens.pipeline.storage.readers import connect

T0 = 1_796_000_000_000_000_000
WARN = "node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : error 12"
RES = '{"host.name": "h01", "service.name": "big"}'


def row(n: int, *, ts: int = T0, observed: int | None = None, body: str = WARN,
        resource: str = RES, service: str = "big", attrs: str = "{}",
        severity: int = 13) -> dict:
    """One stored record, received at ``T0 + n`` (which tells the rows apart in results:
    the receipt time is not part of the key); ``observed`` None: the sender left it 0, so
    the collector put the receipt time there."""
    received = T0 + n
    return {
        c.TS_NS: ts, c.OBSERVED_NS: received if observed is None else observed,
        c.SEVERITY_NUMBER: severity, c.SEVERITY_TEXT: "WARN", c.BODY: body, c.EVENT_NAME: "",
        c.TRACE_ID: "", c.SPAN_ID: "", c.FLAGS: 0, c.SERVICE_NAME: service, c.HOST_NAME: "h01",
        c.RESOURCE_ATTRIBUTES: resource, c.SCOPE_NAME: "", c.SCOPE_VERSION: "",
        c.ATTRIBUTES: attrs, c.DROPPED_ATTRIBUTES_COUNT: 0, c.RECEIVED_NS: received,
    }


def copy(original: dict, n: int) -> dict:
    """``original`` as the collector stores a second delivery, received at ``T0 + n``."""
    received = T0 + n
    again = {**original, c.RECEIVED_NS: received}
    if original[c.OBSERVED_NS] == original[c.RECEIVED_NS]:  # filled in on receipt
        again[c.OBSERVED_NS] = received
    return again


def frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=t.table(t.LOG_RECORDS).schema)


def test_a_resent_copy_is_one_record_and_different_records_stay() -> None:
    filled = row(1)  # no observed time from the sender
    stamped = row(2, ts=T0 + 1, observed=T0 + 9)
    rows = [
        filled, copy(filled, 900),  # the resend: another receipt time
        stamped, copy(stamped, 901),
        # the same copy with the cardinality cap's overflow name: the resource decides
        {**copy(filled, 902), c.SERVICE_NAME: "__overflow__"},
        row(3, ts=T0 + 1, observed=T0 + 10),  # the sender observed it again: a 2nd line
        row(4, ts=T0 + 2),  # the same text later
        row(5, resource='{"host.name": "h02", "service.name": "big"}'),  # another host
        row(6, attrs='{"rank": 1}'),  # other attributes
        row(7, severity=17),  # another severity
    ]
    kept = dedup_log_records(frame(rows)).collect()
    assert kept[c.RECEIVED_NS].to_list() == [T0 + n for n in range(1, 8)]  # first copies
    assert log_events(frame(rows)).collect().height == 7


def test_records_without_any_time_are_never_merged() -> None:
    """A record with neither time nor observed time is stamped on receipt: each copy gets
    another time, so copies cannot be recognized (kept both), and nothing is merged."""
    bare = {**row(1), c.TS_NS: T0 + 1}  # ts = observed = received
    again = {**copy(bare, 70), c.TS_NS: T0 + 70}
    assert dedup_log_records(frame([bare, again])).collect().height == 2


def test_the_sql_view_keeps_the_same_records(tmp_path: Path) -> None:
    filled, stamped = row(1), row(2, ts=T0 + 1, observed=T0 + 9)
    first = [filled, stamped, row(3, ts=T0 + 2), row(4, body="other line")]
    second = [copy(filled, 900), copy(stamped, 901), row(5, ts=T0 + 1, observed=T0 + 10)]
    data = DataDir(tmp_path / "data")
    folder = data.table_dir(t.LOG_RECORDS) / "date=2026-12-01" / "hour=10"
    folder.mkdir(parents=True)
    frame(first).write_parquet(folder / "a-000000000001.parquet")
    frame(second).write_parquet(folder / "b-000000000001.parquet")
    view = connect(data, tables=[t.LOG_RECORDS]).sql(
        f"select * from {t.LOG_RECORDS}").pl()
    expected = dedup_log_records(frame(first + second)).collect()
    assert sorted(view[c.RECEIVED_NS]) == sorted(expected[c.RECEIVED_NS]) == [
        T0 + n for n in range(1, 6)]
