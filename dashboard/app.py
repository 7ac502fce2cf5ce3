"""The fleetlens dashboard: one router, render-only pages (``streamlit run dashboard/app.py``).

Started by ``fleetlens dashboard --data-dir D``, which sets ``FLEETLENS_DATA`` and binds
127.0.0.1 unless configured otherwise. Pages live in ``dashboard/views/``; data access is
in :mod:`dashboard.data`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import streamlit as st

from fleetlens.dashboard import auth, data, ui

VIEWS = Path(__file__).parent / "views"

st.set_page_config(page_title="fleetlens", page_icon=":material/monitoring:", layout="wide")
auth.require_login(data.config())

PAGES = {
    "Fleet": [
        st.Page(VIEWS / "overview.py", title="Fleet overview", url_path="fleet",
                icon=":material/dashboard:", default=True),
        # Streamlit serves the default page at "/" only, so a shared link to /overview
        # opened "Page not found" over it: the same page is also served, unlisted, there.
        st.Page(VIEWS / "overview.py", title="Fleet overview", url_path="overview",
                icon=":material/dashboard:", visibility="hidden"),
        st.Page(VIEWS / "incidents.py", title="Incidents", url_path="incidents",
                icon=":material/warning:"),
        st.Page(VIEWS / "incident_detail.py", title="Incident detail", url_path="incident",
                icon=":material/troubleshoot:"),
        st.Page(VIEWS / "availability.py", title="Availability", url_path="availability",
                icon=":material/health_and_safety:"),
        st.Page(VIEWS / "baselines.py", title="Baselines", url_path="baselines",
                icon=":material/show_chart:"),
    ],
    "Resources": [
        st.Page(VIEWS / "kv_cache.py", title="KV cache", url_path="kv-cache",
                icon=":material/memory:"),
        st.Page(VIEWS / "energy.py", title="Energy", url_path="energy", icon=":material/bolt:"),
        st.Page(VIEWS / "leaderboard.py", title="Leaderboard", url_path="leaderboard",
                icon=":material/leaderboard:"),
        st.Page(VIEWS / "capacity.py", title="Capacity", url_path="capacity",
                icon=":material/speed:"),
    ],
    "Explore": [
        st.Page(VIEWS / "traces.py", title="Traces", url_path="traces",
                icon=":material/search:"),
        st.Page(VIEWS / "trace.py", title="Trace explorer", url_path="trace",
                icon=":material/account_tree:"),
        st.Page(VIEWS / "sql.py", title="SQL console", url_path="sql", icon=":material/code:"),
    ],
}

page = st.navigation(PAGES)
started = time.perf_counter()
try:
    st.session_state["filters"] = ui.sidebar()
    if os.environ.get("FLEETLENS_PROFILE"):
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
        try:
            page.run()
        finally:
            prof.disable()
            prof.dump_stats(os.environ["FLEETLENS_PROFILE"])
    else:
        page.run()
finally:
    # Server-side run time of this page (read by bench/dashboard.py and shown in the sidebar).
    st.session_state["_render_ms"] = (time.perf_counter() - started) * 1000
