"""The trace explorer's side by side (issue 35 item 4 in the dashboard): a request of the
demo's incident next to the median request around it, and next to another request named in
the link (``?vs=``); the table is what analytics' side_by_side returns."""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.traces.side_by_side import median_row, request_row, side_by_side
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import connect, scan


def _open(at, **query: str):  # noqa: ANN001, ANN202
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page("views/trace.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return pl.from_pandas(next(d for d in at.dataframe if "field" in d.value.columns).value)


def test_a_request_next_to_the_median_and_next_to_another(app, demo_data) -> None:
    root, fleet = demo_data
    host, start, end = fleet.incident
    requests = scan(root, t.REQUESTS).collect()
    slow = requests.filter((pl.col(c.HOST_NAME) == host)
                           & pl.col(c.ARRIVAL_NS).is_between(start, end)).sort(c.QUEUE_S)[-1]
    calm = requests.filter(pl.col(c.HOST_NAME) != host)[0]
    con = connect(root, tables=(t.REQUESTS, t.ENGINE_SAMPLES))
    try:
        a = request_row(con, slow[c.REQUEST_ID][0])
        expected = side_by_side(a, median_row(con, a))
        expected_vs = side_by_side(a, request_row(con, calm[c.REQUEST_ID][0]))
    finally:
        con.close()
    shown = _open(app, id=slow[c.TRACE_ID][0], t=str(slow[c.ARRIVAL_NS][0]))
    assert shown["field"].to_list() == expected["field"].to_list()
    assert shown[shown.columns[1]].to_list() == expected["a"].to_list()
    assert shown[shown.columns[2]].to_list() == expected["b"].to_list()
    assert shown.columns[2].startswith("median of ")
    queue = dict(zip(shown["field"], shown[shown.columns[3]], strict=True))[c.QUEUE_S]
    assert queue > 0.3  # the incident's long queue against its service's median
    app.text_input(key="trace_vs").set_value(calm[c.REQUEST_ID][0]).run()
    assert app.query_params["vs"] == calm[c.REQUEST_ID][0]
    shown = pl.from_pandas(next(d for d in app.dataframe if "field" in d.value.columns).value)
    assert shown[shown.columns[2]].to_list() == expected_vs["b"].to_list()
    assert shown.columns[2].startswith(calm[c.REQUEST_ID][0])
