"""``fleetlens sql`` runs in the read-only, bounded sandbox; its output is never markup.

Each test drives the real command (click's CliRunner over the installed ``fleetlens`` group)
against a real data directory on disk.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.cli import cli
from fleetlens.pipeline.sandbox import NotReadOnly, QueryRejected, SandboxLimits, run_read_only
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic


@pytest.fixture
def root(tmp_path: Path) -> DataDir:
    data = DataDir(tmp_path / "data")
    frame = pl.DataFrame({c.TRACE_ID: ["0af7651916cd43dd8448eb211c80319c"],
                          c.SPAN_ID: ["b7ad6b7169203331"], c.NAME: ["llm_request"]})
    write_parquet_atomic(frame, data.raw_segment_path("spans", 10**18, "w", 1))
    return data


def sql(root: DataDir, *args: str):  # noqa: ANN201 - click Result
    # A wide terminal, so that a cell is not folded across lines.
    return CliRunner().invoke(cli, ["sql", "--data-dir", str(root.root), *args],
                              env={"COLUMNS": "400"})


def test_files_outside_the_data_dir_cannot_be_read(root: DataDir, tmp_path: Path) -> None:
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for query in (f"select * from read_csv('{secret}')", f"select * from read_text('{secret}')",
                  "select * from glob('/etc/*')"):
        out = sql(root, query, "--format", "csv")
        assert out.exit_code == 1, (query, out.output)
        assert "Permission" in out.output and "root:x" not in out.output


def test_explain_analyze_cannot_write_a_file(root: DataDir, tmp_path: Path) -> None:
    # Inside the data dir too: DuckDB's allow-list for the views would let COPY write there.
    targets = [tmp_path / "out.csv", root.root / "raw" / "out.csv"]
    for target in targets:
        for query in (f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}'",
                      f"/* hi */ explain analyze copy (select 1) to '{target}' (format csv)"):
            out = sql(root, query)
            assert out.exit_code == 2, (query, out.output)
            assert "read-only" in out.output and "COPY" in out.output
        out = sql(root, f"EXPLAIN (FORMAT json) COPY (SELECT 1) TO '{target}'")
        assert out.exit_code == 2 and "plain EXPLAIN [ANALYZE]" in out.output, out.output
    assert not any(t.exists() for t in targets)
    explained = sql(root, "EXPLAIN ANALYZE SELECT count(*) FROM spans", "--format", "csv")
    assert explained.exit_code == 0 and "analyzed_plan" in explained.output, explained.output


def _evil_segment(root: DataDir) -> Path:
    """Where a forged raw segment would be picked up by the pipeline as the collector's own."""
    return root.raw_segment_path("spans", 10**18, "evil", 1)


# The exploit of issue 33 and its relatives: something that looks like the end of an option list
# (or a keyword) hidden in a comment or a string, nested parentheses, non-ASCII text before the
# statement (DuckDB's token positions are byte offsets), VERBOSE.
_FORGE = "COPY (SELECT 'forged' AS name) TO '{target}' (FORMAT parquet)"
_HIDDEN_WRITES = [
    "EXPLAIN ( /* ) SELECT 1 -- */ ANALYZE ) " + _FORGE,
    "EXPLAIN (ANALYZE, FORMAT ')') " + _FORGE,
    "EXPLAIN ((ANALYZE)) " + _FORGE,
    "EXPLAIN (ANALYZE) " + _FORGE,
    "EXPLAIN ANALYZE /* ) SELECT 1 */ " + _FORGE,
    "EXPLAIN ANALYZE VERBOSE " + _FORGE,
    "/* ) é€ ( */ EXPLAIN ANALYZE -- ü )\n " + _FORGE,
    "EXPLAIN ANALYSE " + _FORGE,
]


@pytest.mark.parametrize("template", _HIDDEN_WRITES)
def test_explain_cannot_hide_a_write_in_comments_strings_or_parentheses(
        root: DataDir, template: str) -> None:
    target = _evil_segment(root)
    query = template.format(target=target)
    out = sql(root, query)
    assert out.exit_code in (1, 2), (query, out.output)  # refused (2) or not SQL at all (1)
    assert not target.exists(), query
    count = sql(root, "SELECT count(*) AS n FROM spans", "--format", "csv")
    assert count.output.splitlines() == ["n", "1"], count.output


def test_the_dashboard_console_refuses_the_hidden_write(root: DataDir) -> None:
    # The console never allows EXPLAIN: a guard that it stays so, not a regression of issue 33.
    from fleetlens.dashboard.sql_console import SqlRejected, run_query

    target = _evil_segment(root)
    for template in _HIDDEN_WRITES:
        with pytest.raises(SqlRejected, match="got EXPLAIN|syntax error"):
            run_query(root, template.format(target=target), row_cap=10)
    assert not target.exists()


def test_plain_explain_still_explains_past_comments_and_strings(root: DataDir) -> None:
    query = ("/* ) é ( */ EXPLAIN ANALYZE -- (\n SELECT ')' AS p, '/*' AS q, count(*) "
             "FROM spans WHERE name <> '(' -- )")
    out = sql(root, query, "--format", "csv")
    assert out.exit_code == 0 and "analyzed_plan" in out.output, out.output
    plain = sql(root, "explain /* ANALYZE ( */ select (((1)))", "--format", "csv")
    assert plain.exit_code == 0 and "physical_plan" in plain.output, plain.output


def test_limits_are_applied_and_locked(root: DataDir) -> None:
    query = ("select current_setting('memory_limit') m, current_setting('threads') t, "
             "current_setting('max_temp_directory_size') d, "
             "current_setting('enable_external_access') e")
    out = sql(root, query, "--memory-mb", "300", "--threads", "1", "--temp-mb", "50",
              "--format", "json")
    assert out.exit_code == 0, out.output
    got = pl.read_json(out.output.encode()).row(0, named=True)
    # DuckDB prints MB (10^6 bytes) as MiB
    assert got == {"m": "286.1 MiB", "t": 1, "d": "47.6 MiB", "e": False}
    out = sql(root, "SET memory_limit = '10GB'")
    assert out.exit_code == 2 and "got SET" in out.output
    locked = run_read_only(root, "select current_setting('lock_configuration') l")
    assert locked.table.to_pylist() == [{"l": True}]


def test_a_query_past_its_memory_and_temp_space_fails_cleanly(root: DataDir) -> None:
    query = ("select count(*) from (select md5(range::varchar) h from range(6000000) "
             "order by h)")
    out = sql(root, query, "--memory-mb", "32", "--temp-mb", "8", "--threads", "1")
    assert out.exit_code == 1, out.output
    assert "memory or temp-space limit (32 MB memory, 8 MB temp)" in out.output


def test_result_bytes_are_capped(root: DataDir) -> None:
    query = "select repeat('x', 10000) as s from range(1000)"  # 10 MB in 1,000 rows
    out = sql(root, query, "--format", "csv", "--max-result-mb", "1")
    assert out.exit_code == 1 and "--max-result-mb 1" in out.output
    assert "xxxx" not in out.output  # refused whole: no partial export
    table = sql(root, query, "--max-result-mb", "1", "--max-rows", "1000")
    assert table.exit_code == 0, table.output
    assert "(1000 rows, first" in table.output and "passed --max-result-mb 1" in table.output
    got = run_read_only(root, query, SandboxLimits(result_mb=1), row_cap=1000)
    assert got.cut == "bytes" and 0 < got.table.num_rows < 1000
    assert got.table.nbytes <= 1 << 20
    whole = sql(root, query, "--format", "csv", "--max-result-mb", "20")
    assert whole.exit_code == 0 and whole.output.count("\n") == 1001


def test_telemetry_values_are_never_markup(root: DataDir) -> None:
    query = ("select 'markup-[/]' as service, '[link=http://evil.example]ok[/link]' as link, "
             "'a' || chr(27) || ']0;owned' || chr(7) || chr(27) || '[2J' || 'b' as esc, "
             "'x' || chr(155) || '31m' as csi, '[bold]h' as \"[red]col\"")
    out = sql(root, query)
    assert out.exit_code == 0, out.output
    assert "markup-[/]" in out.output
    assert "[link=http://evil.example]ok[/link]" in out.output
    assert "[red]col" in out.output and "[bold]h" in out.output
    assert "\x1b" not in out.output and "\x9b" not in out.output and "\x07" not in out.output
    assert "a\\x1b]0;owned\\x07\\x1b[2Jb" in out.output and "x\\x9b31m" in out.output


def test_statement_check_of_the_shared_sandbox(root: DataDir) -> None:
    with pytest.raises(NotReadOnly, match="got EXPLAIN"):
        run_read_only(root, "EXPLAIN SELECT 1")  # the dashboard does not allow EXPLAIN
    assert run_read_only(root, "EXPLAIN SELECT 1", allow_explain=True).table.num_rows == 1
    with pytest.raises(NotReadOnly, match="got CREATE"):
        run_read_only(root, "EXPLAIN ANALYZE CREATE TABLE x AS SELECT 1", allow_explain=True)
    with pytest.raises(QueryRejected, match="stopped after 0.3 s"):
        run_read_only(root, "select count(*) from range(100000000000) a, range(10) b",
                      SandboxLimits(timeout_s=0.3))


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_csv_and_json_on_a_terminal_escape_control_characters(root: DataDir, fmt: str,
                                                               tmp_path: Path) -> None:
    import os
    import pty
    import subprocess
    import sys

    query = "select 'a' || chr(27) || ']0;owned' || chr(7) || 'b' || chr(155) || 'c' as v"
    command = [sys.executable, "-m", "fleetlens", "sql", "--data-dir", str(root.root),
               "--format", fmt, query]
    master, slave = pty.openpty()  # a real terminal on stdout
    try:
        proc = subprocess.run(command, stdout=slave, stderr=subprocess.PIPE, timeout=120,
                              check=False)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert proc.returncode == 0, proc.stderr
    assert b"\x1b" not in seen and b"\x07" not in seen and "\x9b".encode() not in seen
    # csv: escaped here; json: JSON escapes C0 itself (\u001b) and C1 is escaped here
    assert (b"\\x1b]0;owned" if fmt == "csv" else b"\\u001b]0;owned") in seen
    assert b"b\\x9bc" in seen
    redirected = subprocess.run(command, capture_output=True, timeout=120, check=True)
    if fmt == "csv":  # to a file or a pipe the data stay as they are
        assert "a\x1b]0;owned\x07b\x9bc".encode() in redirected.stdout
