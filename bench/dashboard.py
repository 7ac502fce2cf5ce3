"""Per-page server-side run time of the dashboard on a simulated day of a 64-GPU fleet.

Builds (or reuses) a contract-shaped data directory with the seeded builder of the dashboard
tests: 8 hosts x 8 GPUs, 24 hours, ~0.4 requests/s per GPU (about 2.2M requests, 4.4M spans,
the windows, samples, energy, baselines and an incident). Then runs every page with
Streamlit's AppTest (the same script run a browser triggers, minus the websocket) and prints,
per page, the server-side script time the app measures itself: the first run after emptying
every cache (cold: new DuckDB connection, every frame read from Parquet) and the median of
warm reruns (cached frames, as when a user changes a widget or another user opens the page),
plus AppTest's wall time per warm run (includes its polling). Budget: 300 ms per page.

Peer, measured in the same run: a minimal Streamlit page (a title and a metric, no data) is
the framework's floor; each page's warm ratio to it is printed.

    .venv/bin/python bench/dashboard.py [--data-dir DIR] [--hours 24] [--reps 7]
                                        [--pages traces,trace]   (a subset, by file name)

The Traces page is run three ways: its default search with the heatmap of every request in
the range (no selection), the same with the injected incident's slow band selected (the
heatmap's comparison: ``hm_*`` in the URL, as a box drawn on it leaves them), and a search
narrowed to the incident's host and an hour. The trace explorer (``trace?id=``) is run from a
link (with the arrival time) and with the id typed by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleetlens.pipeline.storage import DataDir  # noqa: E402
from tests.dashboard.synth import Fleet, build_all  # noqa: E402

APP = REPO / "dashboard" / "app.py"
PAGES = ["overview", "incidents", "incident_detail", "baselines", "kv_cache", "energy",
         "leaderboard", "traces", "trace", "sql"]
BUDGET_MS = 300.0
FLOOR_PAGE = "import streamlit as st\n"


def timed_run(at) -> tuple[float, float]:  # noqa: ANN001 - AppTest
    """(server-side script ms as the app measures it, AppTest wall ms)."""
    start = time.perf_counter()
    at.run()
    wall = (time.perf_counter() - start) * 1000
    if at.exception:
        raise RuntimeError(at.exception[0].value)
    return at.session_state["_render_ms"], wall


def measure(page: str, reps: int, query: dict[str, str]) -> tuple[float, float, float]:
    """Cold (caches emptied: connection, frames) and warm median script ms, warm wall ms."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=600)
    # The link's parameters before the first run: the sidebar takes its range and scope from
    # the URL only when it first draws them (set after it, a link's range was ignored).
    for key, value in query.items():
        at.query_params[key] = value
    at.run()  # the default page, so navigation to ``page`` is a normal switch
    at.switch_page(f"views/{page}.py")
    st.cache_data.clear()
    st.cache_resource.clear()
    cold, _ = timed_run(at)
    warm = [timed_run(at) for _ in range(reps)]
    return (cold, statistics.median(w[0] for w in warm), statistics.median(w[1] for w in warm))


def floor(reps: int) -> float:
    """Script time of a minimal Streamlit page (a title and a metric, no data)."""
    from streamlit.testing.v1 import AppTest

    script = FLOOR_PAGE + ("import time\nt0 = time.perf_counter()\nst.title('floor')\n"
                           "st.metric('x', 1)\n"
                           "st.session_state['_render_ms'] = (time.perf_counter() - t0) * 1e3\n")
    at = AppTest.from_string(script)
    at.run()
    return statistics.median(timed_run(at)[0] for _ in range(reps))


def traces_runs(fleet: Fleet) -> list[tuple[str, str, dict[str, str]]]:
    """The Traces page's runs: its default search and heatmap, the injected incident's slow
    band selected on it (queue time over 0.3 s during the incident: the host's KV pressure),
    and a search of the incident's host over the hour around it."""
    host, start, end = fleet.incident
    band = {"hm": "queue_s", "hm_from": str(start), "hm_to": str(end), "hm_min": "0.3"}
    hour = {"range": "custom", "from": _minute(start - 1800 * 10**9),
            "to": _minute(start + 1800 * 10**9), "host": host, "sort": "-queue_s"}
    return [("traces (search)", "traces", {}), ("traces (select)", "traces", band),
            ("traces (1 host)", "traces", hour)]


def _minute(ns: int) -> str:
    """``ns`` as the sidebar's custom-range URL form (whole minutes, UTC)."""
    import datetime as dt

    moment = dt.datetime.fromtimestamp(ns // 10**9 // 60 * 60, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%MZ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="reuse or create the data set here")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--rps-per-gpu", type=float, default=0.4)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--pages", default=",".join(PAGES),
                        help="comma-separated page files to run (default: all)")
    args = parser.parse_args()
    root = DataDir(args.data_dir or Path(tempfile.mkdtemp(prefix="fleetlens-bench-")) / "d")
    fleet = Fleet(hosts=8, gpus_per_host=8, hours=args.hours, rps_per_gpu=args.rps_per_gpu)
    if not (root.root / "derived").exists():
        start = time.perf_counter()
        build_all(root, fleet)
        print(f"built {args.hours:g} h of a 64-GPU fleet in {time.perf_counter() - start:.0f} s"
              f" at {root.root}")
    else:
        print(f"reusing {root.root}")
    from fleetlens.pipeline.storage import connect

    con = connect(root)
    for table in ("requests", "spans", "windows", "gpu_samples", "engine_samples", "baselines"):
        rows = con.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        print(f"  {table:<15} {rows:>12,} rows")
    os.environ["FLEETLENS_DATA"] = str(root.root)
    incident = con.sql("SELECT min(incident_id) FROM incidents").fetchall()[0][0]
    trace = con.sql("SELECT trace_id FROM requests ORDER BY e2e_s DESC LIMIT 1").fetchall()[0][0]
    arrival = con.execute("SELECT arrival_ns FROM requests WHERE trace_id = ?", [trace]).fetchall()
    runs = [(page, page, {}) for page in PAGES]
    runs[PAGES.index("incident_detail")] = ("incident_detail", "incident_detail", {"id": incident})
    # A link from the dashboard carries the arrival time; an id typed by hand does not.
    runs[PAGES.index("trace")] = ("trace (link)", "trace", {"id": trace, "t": str(arrival[0][0])})
    runs.insert(PAGES.index("trace") + 1, ("trace (typed id)", "trace", {"id": trace}))
    runs[PAGES.index("traces"):PAGES.index("traces") + 1] = traces_runs(fleet)
    wanted = set(args.pages.split(","))
    runs = [run for run in runs if run[1] in wanted]
    base = floor(args.reps)
    print(f"\nfloor (minimal Streamlit page, script time): {base:.2f} ms\n")
    print(f"{'page':<16} {'cold ms':>8} {'warm ms':>8} {'warm/floor':>10} {'wall ms':>8}"
          f"  (budget {BUDGET_MS:.0f} ms server-side)")
    for label, page, query in runs:
        cold, warm, wall = measure(page, args.reps, query)
        verdict = "ok" if max(cold, warm) <= BUDGET_MS else (
            "warm ok, cold OVER" if warm <= BUDGET_MS else "OVER")
        print(f"{label:<16} {cold:>8.0f} {warm:>8.1f} {warm / base:>9.0f}x {wall:>8.0f}  {verdict}")

if __name__ == "__main__":
    main()
