"""A read-only, resource-bounded DuckDB for user SQL (``fleetlens sql``, the dashboard console).

Every query gets a fresh in-memory DuckDB with one view per fleetlens table
(:func:`pipeline.storage.connect`) and then, before the user's SQL runs:

- statement check: exactly one ``SELECT`` (``WITH``, ``FROM``, ``SHOW``, ``DESCRIBE`` and
  ``SUMMARIZE`` are SELECTs too), or, where allowed, plain ``EXPLAIN [ANALYZE]`` of one. ``EXPLAIN
  ANALYZE`` *runs* its statement, so ``EXPLAIN ANALYZE COPY ... TO 'file'`` would write: the
  explained statement is cut from the query at a token boundary found by DuckDB's own
  tokenizer (so comments and strings are what DuckDB says they are) and checked like a
  top-level one; option lists (``EXPLAIN (...)``) are refused, since telling an option list
  from a parenthesised statement needs the grammar, not the tokens;
- file access: external access off, only the data directory's ``raw/`` and ``derived/`` readable
  (the views read their Parquet lazily); DuckDB's allow-list also permits *writing* there,
  which is why the statement check, not the file sandbox, is what stops ``COPY``;
- resources: ``memory_limit``, ``threads``, a private ``temp_directory`` (removed afterwards)
  with ``max_temp_directory_size``; then ``lock_configuration`` so the query cannot undo any
  of it;
- results: streamed in Arrow batches and cut at ``row_cap`` rows or ``result_mb`` bytes, so a
  few huge rows cannot pass a row cap, and an optional timer interrupts long queries.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetlens.pipeline.storage import (
    DataDir,
    connect,
    damaged_error,
    retry_vanished,
    tables_named_in,
    unreadable_files,
)

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

MB = 1 << 20
#: Rows per Arrow batch read from DuckDB: one DuckDB vector, so the byte cap is felt early
#: (a batch is the unit that arrives whole: 2,048 rows of 1 MB each still make 2 GB).
BATCH_ROWS = 2048
_PLAIN_EXPLAIN = "only plain EXPLAIN [ANALYZE] <SELECT> is allowed"


class QueryRejected(ValueError):
    """The SQL is not one read-only query, broke a limit, or failed; the message says why."""


class NotReadOnly(QueryRejected):
    """The SQL is not exactly one read-only statement (a usage error, not a failure)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one user query may use."""

    #: DuckDB's memory limit (its buffer manager; spills beyond go to the temp directory).
    memory_mb: int = 1024
    #: DuckDB worker threads.
    threads: int = 2
    #: Largest spill to the query's private temp directory.
    temp_mb: int = 1024
    #: Largest result (Arrow bytes) that comes back; more is cut (or refused, see ``strict``).
    result_mb: int = 256
    #: Interrupt the query after this long (``None``: never).
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("memory_mb", "threads", "temp_mb", "result_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


@dataclass(frozen=True)
class Fetched:
    """A query's result, possibly cut short.

    Attributes:
        table: the rows kept (at most the row cap, at most about the byte cap).
        cut: ``None`` when complete, else ``"rows"`` or ``"bytes"``: which cap cut it.
        total_rows: rows the query produced when counted to the end (``count_all``), else
            the rows seen before stopping.
    """

    table: pa.Table
    cut: str | None
    total_rows: int


def check_read_only(con: duckdb.DuckDBPyConnection, query: str, *,
                    allow_explain: bool = False) -> None:
    """Raise :class:`QueryRejected` unless ``query`` is one SELECT (or EXPLAIN of one)."""
    import duckdb

    if not query.strip():
        raise NotReadOnly("enter a query")
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryRejected(f"syntax error: {exc}") from None
    if len(statements) != 1:
        raise NotReadOnly(f"expected exactly one query, got {len(statements)} statements")
    kind = statements[0].type
    if kind == duckdb.StatementType.EXPLAIN and allow_explain:
        # EXPLAIN ANALYZE runs the statement: it must be a SELECT like any other.
        check_read_only(con, _explained(query), allow_explain=False)
        return
    if kind != duckdb.StatementType.SELECT:
        allowed = "SELECT or EXPLAIN SELECT" if allow_explain else "SELECT"
        raise NotReadOnly(f"only {allowed} queries are allowed: read-only (got {kind.name})")


def _explained(query: str) -> str:
    """The statement that ``EXPLAIN [ANALYZE] <statement>`` explains, as DuckDB tokenizes it.

    A regex once took the first ``)`` as the end of an option list even inside a comment, so
    ``EXPLAIN ( /* ) SELECT 1 -- */ ANALYZE ) COPY ...`` passed as a SELECT and wrote a file.
    Here comments and strings are DuckDB's own tokens, and only the two grammar forms whose
    explained statement is unambiguous from tokens alone are accepted.

    Raises:
        NotReadOnly: for an option list, ``VERBOSE`` or anything else before the statement.
    """
    import duckdb

    # Positions are byte offsets into the UTF-8 text (a comment may hold any character); a
    # token's text runs to the next token's start.
    raw = query.encode()
    found = duckdb.tokenize(query)
    ends = [pos for pos, _ in found[1:]] + [len(raw)]
    tokens = [(pos, raw[pos:end].decode().strip().upper())
              for (pos, kind), end in zip(found, ends, strict=True)
              if kind != duckdb.token_type.comment]
    words = [word for _, word in tokens]
    start = 2 if words[1:2] in (["ANALYZE"], ["ANALYSE"]) else 1
    if words[:1] != ["EXPLAIN"] or len(tokens) <= start:
        raise NotReadOnly(f"could not tell which statement EXPLAIN explains: {_PLAIN_EXPLAIN}")
    if words[start] in ("(", "VERBOSE"):
        # An option list may hide ANALYZE, and "(SELECT 1)" looks like one: refuse both.
        raise NotReadOnly(f"EXPLAIN options are not allowed: {_PLAIN_EXPLAIN}")
    return raw[tokens[start][0]:].decode()


@contextlib.contextmanager
def sandbox(root: DataDir, query: str, limits: SandboxLimits, *,
            allow_explain: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    """A locked-down connection for ``query`` (checked first), closed and cleaned afterwards.

    Raises:
        QueryRejected: when ``query`` is not one read-only statement.
    """
    import duckdb

    # Views of the tables the query names only (each view reads its files' footers); a query
    # that names none (SHOW TABLES, information_schema) gets them all.
    try:
        con = connect(root, tables=tables_named_in(query) or None)
    except duckdb.Error as exc:  # e.g. a Parquet file cut short outside fleetlens
        bad = unreadable_files(root.root / "raw") + unreadable_files(root.root / "derived")
        raise QueryRejected(str(damaged_error(root, bad)) if bad else f"query failed: {exc}"
                            ) from None
    spill = tempfile.mkdtemp(prefix="fleetlens-sql-")
    try:
        check_read_only(con, query, allow_explain=allow_explain)
        readable = [str(root.root / "raw") + "/", str(root.root / "derived") + "/"]
        con.execute(f"SET memory_limit = '{limits.memory_mb}MB'")
        con.execute(f"SET threads = {limits.threads}")
        con.execute("SET temp_directory = $dir", {"dir": spill})
        con.execute(f"SET max_temp_directory_size = '{limits.temp_mb}MB'")
        con.execute("SET allowed_directories = $dirs", {"dirs": readable})
        con.execute("SET enable_external_access = false")
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET lock_configuration = true")
        yield con
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def fetch(con: duckdb.DuckDBPyConnection, query: str, limits: SandboxLimits, *,
          row_cap: int | None = None, params: dict[str, Any] | None = None,
          count_all: bool = False) -> Fetched:
    """Run ``query`` and keep at most ``row_cap`` rows and about ``limits.result_mb`` bytes.

    Args:
        con: a connection from :func:`sandbox`.
        query: the (checked) query.
        limits: the byte cap and the timeout.
        row_cap: rows kept (``None``: no row cap, only the byte cap).
        params: named parameters bound to the query.
        count_all: after a cap is hit, keep reading (and dropping) batches to count rows.

    Raises:
        QueryRejected: on SQL errors, on DuckDB's memory/temp limits and on timeout.
    """
    import duckdb
    import pyarrow as pa

    byte_cap = limits.result_mb * MB
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(limits.timeout_s, stop) if limits.timeout_s is not None else None

    def read() -> Fetched:
        reader = con.sql(query, params=params or None).to_arrow_reader(BATCH_ROWS)
        kept: list[pa.RecordBatch] = []
        rows = size = seen = 0
        cut: str | None = None
        for batch in reader:
            seen += batch.num_rows
            if cut is not None:
                continue  # counting only
            if row_cap is not None and rows + batch.num_rows > row_cap:
                batch, cut = batch.slice(0, row_cap - rows), "rows"
            if size + batch.nbytes > byte_cap:
                batch, cut = _within(batch, byte_cap - size), "bytes"
            kept.append(batch)
            rows, size = rows + batch.num_rows, size + batch.nbytes
            if cut is not None and not count_all:
                break
        return Fetched(pa.Table.from_batches(kept, schema=reader.schema), cut, seen)

    if timer is not None:
        timer.start()
    try:
        return retry_vanished(read)  # compaction may delete a file the query listed
    except duckdb.InterruptException:
        raise QueryRejected(f"query stopped after {limits.timeout_s:g} s") from None
    except duckdb.OutOfMemoryException as exc:
        raise QueryRejected(f"query passed its memory or temp-space limit "
                            f"({limits.memory_mb} MB memory, {limits.temp_mb} MB temp): "
                            f"{str(exc).splitlines()[0]}") from None
    except duckdb.Error as exc:
        raise QueryRejected(f"query failed: {exc}") from None
    except OSError:
        # An interrupt while Arrow pulls the result's batches comes back from its stream
        # reader as a bare OSError ("INTERRUPT Error: Interrupted!"), not as DuckDB's own.
        if fired.is_set():
            raise QueryRejected(f"query stopped after {limits.timeout_s:g} s") from None
        raise
    finally:
        if timer is not None:
            timer.cancel()


def _within(batch: pa.RecordBatch, budget: int) -> pa.RecordBatch:
    """The longest head of ``batch`` of at most ``budget`` bytes (by average row size)."""
    if batch.num_rows == 0 or budget <= 0:
        return batch.slice(0, 0)
    per_row = max(1, batch.nbytes // batch.num_rows)
    return batch.slice(0, min(batch.num_rows, budget // per_row))


def run_read_only(root: DataDir, query: str, limits: SandboxLimits | None = None, *,
                  row_cap: int | None = None, params: dict[str, Any] | None = None,
                  allow_explain: bool = False, count_all: bool = False) -> Fetched:
    """Check ``query``, run it in a :func:`sandbox` and :func:`fetch` its capped result."""
    limits = limits or SandboxLimits()
    with sandbox(root, query, limits, allow_explain=allow_explain) as con:
        return fetch(con, query, limits, row_cap=row_cap, params=params, count_all=count_all)


__all__ = ["Fetched", "NotReadOnly", "QueryRejected", "SandboxLimits", "check_read_only", "fetch",
           "run_read_only", "sandbox"]
