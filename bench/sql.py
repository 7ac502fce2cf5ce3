"""Ad-hoc SQL start-up: views of the tables a query names against views of every table.

``fleetlens sql`` and the dashboard's SQL console open a fresh DuckDB per query. Making a view
over Parquet reads every file's footer, so a data directory with thousands of raw segments
made every query pay for them, whatever it read. This prints, for a few queries, the median
seconds of connect + query both ways (same process, alternating) and the ratio.

    .venv/bin/python bench/sql.py DATA_DIR [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetlens.pipeline.storage import DataDir, connect, tables_named_in  # noqa: E402

QUERIES = (
    "select count(*) from requests",
    "select host_name, max(e2e_p99_s) from windows group by 1 order by 2 desc limit 5",
    "select count(*) from spans",
)


def _timed(dd: DataDir, query: str, tables: list[str] | None) -> float:
    began = time.perf_counter()
    con = connect(dd, tables=tables)
    con.execute(query).fetchall()
    con.close()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    dd = DataDir(args.data_dir)
    files = sum(1 for _ in dd.root.rglob("*.parquet"))
    print(f"{dd.root}: {files:,} Parquet files; median of {args.runs} runs each")
    for query in QUERIES:
        every, named = [], []
        for _ in range(args.runs):
            every.append(_timed(dd, query, None))
            named.append(_timed(dd, query, tables_named_in(query)))
        a, b = statistics.median(every), statistics.median(named)
        print(f"  {query[:60]:60s}  every table {a:6.3f} s  named only {b:6.3f} s  "
              f"ratio {a / b:5.1f}x")


if __name__ == "__main__":
    main()
