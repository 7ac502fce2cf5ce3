"""The SQL console: one read-only SELECT, capped, sandboxed, filters as bound parameters."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.dashboard.filters import Filters
from fleetlens.dashboard.sql_console import (
    CONSOLE_LIMITS,
    SqlRejected,
    filter_params,
    run_query,
)
from fleetlens.pipeline.sandbox import SandboxLimits
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import scan
from tests.dashboard.synth import SERVICES


def test_select_returns_rows(demo_data) -> None:
    root = demo_data[0]
    result = run_query(root, f"SELECT count(*) AS n FROM {t.REQUESTS}", row_cap=10)
    assert result.frame["n"][0] == scan(root, t.REQUESTS).select(pl.len()).collect().item()
    assert not result.truncated


def test_results_are_capped(demo_data) -> None:
    result = run_query(demo_data[0], f"SELECT * FROM {t.REQUESTS}", row_cap=7)
    assert result.frame.height == 7 and result.truncated


@pytest.mark.parametrize("query,why", [
    (f"DROP VIEW {t.REQUESTS}", "only SELECT"),
    (f"CREATE TABLE x AS SELECT * FROM {t.REQUESTS}", "only SELECT"),
    ("SELECT 1; SELECT 2", "exactly one"),
    ("COPY (SELECT 1) TO 'out.csv'", "only SELECT"),
    ("ATTACH 'other.db'", "only SELECT"),
    ("INSTALL httpfs", "only SELECT"),
    ("SET enable_external_access = true", "only SELECT"),
    ("SELECT * FROM read_csv('/etc/passwd')", "Permission"),
    ("SELECT * FROM read_text('/etc/hostname')", "Permission"),
    ("SELECT $nope", "unknown parameter"),
    ("SELEC 1", "syntax"),
    ("", "enter a query"),
])
def test_rejects_anything_but_one_read_only_select(demo_data, query: str, why: str) -> None:
    with pytest.raises(SqlRejected, match=why):
        run_query(demo_data[0], query, row_cap=10, params=filter_params(Filters()))


def test_reading_the_wal_and_state_is_refused(demo_data) -> None:
    root = demo_data[0]
    root.state.mkdir(parents=True, exist_ok=True)
    (root.state / "x.json").write_text("{}")
    with pytest.raises(SqlRejected, match="Permission"):
        run_query(root, f"SELECT * FROM read_text('{root.state / 'x.json'}')", row_cap=10)


@pytest.mark.parametrize("value", [SERVICES[1], "x' OR '1'='1", "'; DROP VIEW requests; --"])
def test_filters_are_bound_parameters(demo_data, value: str) -> None:
    root = demo_data[0]
    params = filter_params(Filters(services=(value,)))
    query = (f"SELECT {c.REQUEST_ID} FROM {t.REQUESTS} "
             f"WHERE list_contains($services, {c.SERVICE_NAME})")
    got = run_query(root, query, row_cap=1_000_000, params=params).frame
    ref = scan(root, t.REQUESTS).filter(pl.col(c.SERVICE_NAME) == value).collect()
    assert sorted(got[c.REQUEST_ID]) == sorted(ref[c.REQUEST_ID])
    # and the views are intact afterwards
    assert run_query(root, f"SELECT count(*) AS n FROM {t.REQUESTS}", row_cap=1).frame["n"][0]


def test_long_query_is_interrupted(demo_data) -> None:
    query = "SELECT count(*) FROM range(100000000000) a"
    with pytest.raises(SqlRejected, match="stopped"):
        run_query(demo_data[0], query, row_cap=1, timeout_s=0.5)


def test_the_region_filter_is_a_parameter_too(demo_data) -> None:
    root = demo_data[0]
    params = filter_params(Filters(regions=("us-east",)))
    query = (f"SELECT DISTINCT {c.HOST_NAME} FROM {t.REQUESTS} "
             f"WHERE list_contains($regions, {c.REGION}) ORDER BY 1")
    got = run_query(root, query, row_cap=100, params=params).frame
    ref = scan(root, t.REQUESTS).filter(pl.col(c.REGION) == "us-east").select(
        c.HOST_NAME).unique().sort(c.HOST_NAME).collect()
    assert got[c.HOST_NAME].to_list() == ref[c.HOST_NAME].to_list() and got.height > 0


def test_a_few_huge_rows_do_not_pass_the_row_cap(demo_data) -> None:
    # 1,000 rows of 100 kB: under the row cap, far over the console's result bytes
    query = "SELECT repeat('x', 100000) AS s FROM range(1000)"
    result = run_query(demo_data[0], query, row_cap=10_000,
                       limits=SandboxLimits(result_mb=2, timeout_s=30))
    assert result.truncated and result.cut == "bytes"
    assert 0 < result.frame.height < 1000 and result.frame.estimated_size() <= 2 << 20


def test_the_console_runs_with_bounded_memory_and_threads(demo_data) -> None:
    query = ("SELECT current_setting('memory_limit') AS m, current_setting('threads') AS t, "
             "current_setting('lock_configuration') AS l")
    row = run_query(demo_data[0], query, row_cap=1).frame.row(0, named=True)
    assert row == {"m": "488.2 MiB", "t": CONSOLE_LIMITS.threads, "l": True}
    heavy = ("SELECT count(*) FROM (SELECT md5(range::varchar) h FROM range(6000000) "
             "ORDER BY h)")
    with pytest.raises(SqlRejected, match="memory or temp-space limit"):
        run_query(demo_data[0], heavy, row_cap=1,
                  limits=SandboxLimits(memory_mb=32, temp_mb=8, threads=1, timeout_s=60))
