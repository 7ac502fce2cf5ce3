"""SQL console: read-only DuckDB over the data directory, results capped."""

import streamlit as st

from fleetlens.dashboard import data
from fleetlens.dashboard.sql_console import SqlRejected, filter_params, run_query

f = st.session_state["filters"]
cap = data.config().sql_row_cap
st.title("SQL console")
st.caption(f"One SELECT over the tables (spans, requests, windows, incidents, ...). External "
           f"files are off; at most {cap:,} rows come back. The sidebar filters are bound "
           "parameters: $from_ns, $to_ns, $services, $models, $hosts, $regions "
           "(lists: `list_contains($regions, region)`).")
default = ("SELECT service_name, model, count(*) AS requests, quantile_cont(e2e_s, 0.99) AS "
           "e2e_p99_s\nFROM requests\nWHERE ($from_ns IS NULL OR arrival_ns >= $from_ns)\n"
           "GROUP BY ALL ORDER BY requests DESC")
query = st.text_area("Query", value=default, height=160, key="sql_query")
if st.button("Run", key="sql_run", type="primary") or st.session_state.get("sql_ran"):
    st.session_state["sql_ran"] = True
    try:
        result = run_query(data.data_dir(), query, row_cap=cap, params=filter_params(f))
    except SqlRejected as exc:
        st.error(str(exc))
    else:
        note = f" (capped at {cap:,}; more rows matched)" if result.truncated else ""
        st.caption(f"{result.frame.height:,} row(s){note}")
        st.dataframe(result.frame, hide_index=True, key="sql_result")
