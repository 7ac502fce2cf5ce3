"""Peak RSS of one user query: a plain DuckDB (before the sandbox) against the sandbox.

Each case runs in a fresh process (``python bench/sql_sandbox_rss.py CASE QUERY``) so that its
peak RSS is its own; the parent prints one line per query and surface. Two queries: a
600 MB result of 600,000 rows (under a 1,000,000-row cap, the case that passed the row cap)
and a sort that spills (10M md5 strings).

    .venv/bin/python bench/sql_sandbox_rss.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time

QUERIES = {
    "600 MB result": "SELECT repeat('x', 1000) AS s FROM range(600000)",
    "10M-row sort": ("SELECT count(*) FROM (SELECT md5(range::varchar) AS h "
                     "FROM range(10000000) ORDER BY h)"),
}


def _child(case: str, query: str) -> None:
    from fleetlens.pipeline.storage import DataDir

    root = DataDir(tempfile.mkdtemp())
    started = time.perf_counter()
    if case == "plain":  # what the console and fleetlens sql did before
        import duckdb

        rows = duckdb.connect(":memory:").sql(query).limit(1_000_001).pl().height
        note = f"{rows} rows"
    else:
        from fleetlens.dashboard.sql_console import run_query
        from fleetlens.pipeline.sandbox import QueryRejected

        try:
            result = run_query(root, query, row_cap=1_000_000)
            note = f"{result.frame.height} rows, cut by {result.cut}"
        except QueryRejected as exc:
            note = f"refused: {str(exc)[:60]}"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{rss:.0f}\t{time.perf_counter() - started:.1f}\t{note}")


def main() -> None:
    for name, query in QUERIES.items():
        for case in ("plain", "console sandbox"):
            out = subprocess.run([sys.executable, __file__, case, query], capture_output=True,
                                 text=True, check=True).stdout.strip()
            rss, seconds, note = out.split("\t")
            print(f"{name:14s} {case:16s} peak RSS {rss:>6s} MiB  {seconds:>5s} s  {note}")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        _child(sys.argv[1], sys.argv[2])
    else:
        main()
