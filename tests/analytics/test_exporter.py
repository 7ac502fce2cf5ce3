"""`fleetlens exporter` as Prometheus users run it (issue 32, section 2): a real Prometheus
(Debian's 2.42, started here on 127.0.0.1) scrapes a live exporter over a fleet that grows;
the counters are `_total`, the latencies histograms that `histogram_quantile` aggregates
across hosts, no family holds a fleet-wide row, every query of the Grafana dashboard returns
data, and the active incidents are served (0 when none) with a link to their page."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from fleetlens.analytics.exporter_counters import LATENCY_COLUMNS
from fleetlens.analytics.open_incidents import active_incidents, closed_until_ns
from fleetlens.analytics.runner import read_table
from fleetlens.pipeline.schema import CAUSES
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import exported as x
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.exporter_live import (
    DASHBOARD,
    Live,
    expected_requests,
    exporter,
    families,
    live_fleet,
    scrape,
)
from tests.analytics.promservers import Server, binary, wait_for
from tests.analytics.synthetic import FleetSpec, generate
from tests.analytics.synthetic_io import write_tables
from tests.conftest import REPO

BOARD = REPO / "deploy" / "grafana" / "fleetlens.json"
#: what Grafana puts in for the dashboard's variables: every service, model and host, and a
#: rate interval long enough to hold the one increase of the test's counters
VARIABLES = {"$service": ".*", "$model": ".*", "$host": ".*", "$__rate_interval": "1h"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The live exporter, scraped by a real Prometheus when one is installed (the tests of
    the exporter alone run without)."""
    with live_fleet(tmp_path_factory.mktemp("exporter"),
                    with_prometheus=shutil.which("prometheus") is not None) as fleet:
        yield fleet


def prom(live: Live) -> Server:
    """The fleet's Prometheus, or skip the test saying which package it needs."""
    if live.prom is None:
        binary("prometheus")
    assert live.prom is not None
    return live.prom


def board_queries() -> list[str]:
    """Every PromQL expression of the dashboard: panels, annotations, variables."""
    board = json.loads(BOARD.read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    exprs += [v["query"]["query"] for v in board["templating"]["list"]
              if v["type"] == "query"]
    return exprs


def promql(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    # label_values(metric, label) is Grafana's: the series holding the label
    return re.sub(r"label_values\((.+), (\w+)\)", r"group by (\2) (\1)", expr)


def test_counters_are_totals_and_latencies_histograms_without_fleet_rows(live: Live) -> None:
    kinds = families(live.url)
    for name in (x.REQUESTS, x.REQUEST_ERRORS, x.INPUT_TOKENS, x.OUTPUT_TOKENS, x.GPU_ENERGY):
        assert kinds[name] == "counter"
    for name in x.LATENCY_HISTOGRAMS.values():
        assert kinds[name] == "histogram"
    got = scrape(live.url)
    assert "fleetlens_requests_per_second" not in kinds  # a rate is Prometheus' to compute
    assert not [k for k in got if ("host", "*") in k[1]]  # sum by would count twice
    counted = expected_requests(live)
    hosts = counted.group_by(c.HOST_NAME).agg(pl.len(), pl.col(c.IS_ERROR).sum(),
                                              pl.col(c.OUTPUT_TOKENS).sum())
    assert hosts.height == 3
    for host, n, errors, tokens in hosts.iter_rows():
        labels = (("host", host), ("model", counted[c.MODEL][0]),
                  ("service", counted[c.SERVICE_NAME][0]))
        assert got[("fleetlens_requests_total", labels)] == n
        assert got[("fleetlens_request_errors_total", labels)] == errors
        assert got[("fleetlens_output_tokens_total", labels)] == tokens
        assert got[("fleetlens_e2e_seconds_count", labels)] == n
        inf = tuple(sorted((*labels, ("le", "+Inf"))))
        assert got[("fleetlens_ttft_seconds_bucket", inf)] == n


def test_histogram_quantile_across_hosts_lies_in_the_bucket_of_the_true_p99(live: Live) -> None:
    server = prom(live)
    counted = expected_requests(live)
    # one sum over the hosts is every request once
    (total,) = wait_for(lambda: server.query("sum(fleetlens_requests_total)"), "a sum", server)
    assert float(total["value"][1]) == counted.height
    for metric, name in x.LATENCY_HISTOGRAMS.items():
        exact = counted[LATENCY_COLUMNS[metric]].quantile(0.99)
        bounds = (0.0, *x.BUCKETS[metric])
        hi = next(i for i, le in enumerate(bounds) if le >= exact)
        query = f"histogram_quantile(0.99, sum by (le) (rate({name}_bucket[1h])))"
        (row,) = wait_for(lambda q=query: server.query(q), query, server)
        estimate = float(row["value"][1])
        assert bounds[hi - 1] <= estimate <= bounds[hi], (metric, exact, estimate)


def test_every_query_of_the_grafana_dashboard_returns_data(live: Live) -> None:
    server = prom(live)
    queries = board_queries()
    assert len(queries) >= 12
    for expr in queries:
        result = wait_for(lambda e=expr: server.query(promql(e)), f"data for {expr}", server)
        values = [float(r["value"][1]) for r in result]
        assert not [v for v in values if v != v], f"NaN from {expr}"
    # and the shipped recording rules, evaluated by this Prometheus
    for record in ("fleetlens:requests:rate5m", "fleetlens:ttft_seconds:p99_rate5m",
                   "fleetlens:open_incidents:sum"):
        wait_for(lambda r=record: server.query(r), record, server)


def test_active_incidents_are_served_with_a_link_to_their_page(live: Live) -> None:
    got = scrape(live.url)
    incidents = read_table(live.root, t.INCIDENTS)
    # the overview's "Active incidents" (dashboard/views/overview.py): one definition
    active = active_incidents(incidents, closed_until_ns(live.data.windows))
    assert active.height >= 1, "the incident injected at the end is still going"
    info = {dict(labels)[c.INCIDENT_ID]: dict(labels) for (n, labels) in got
            if n == x.INCIDENT_INFO}
    assert set(info) == set(active[c.INCIDENT_ID])
    for ident, labels in info.items():
        assert labels[x.URL] == f"{DASHBOARD}/incident?id={ident}"
    by_cause = {dict(lab)[c.CAUSE]: v for (n, lab), v in got.items() if n == x.OPEN_INCIDENTS}
    assert set(CAUSES) <= set(by_cause) and sum(by_cause.values()) == active.height
    assert by_cause["kv_cache_pressure"] >= 1


def test_each_active_incident_s_phase_split_is_the_stored_rows(live: Live) -> None:
    """The exporter renders analytics' incident_phases rows (what explain and the dashboard
    show), for the active incidents only."""
    got = scrape(live.url)
    active = active_incidents(read_table(live.root, t.INCIDENTS),
                              closed_until_ns(live.data.windows))
    stored = read_table(live.root, t.INCIDENT_PHASES).filter(
        pl.col(c.INCIDENT_ID).is_in(active[c.INCIDENT_ID].implode()))
    assert stored.height >= 4, "queue, prefill, decode, overhead of the incident at the end"
    served = {(dict(lab)[c.INCIDENT_ID], dict(lab)[c.PHASE]): v for (n, lab), v in got.items()
              if n == x.INCIDENT_PHASE_EXCESS}
    shares = {(dict(lab)[c.INCIDENT_ID], dict(lab)[c.PHASE]): v for (n, lab), v in got.items()
              if n == x.INCIDENT_PHASE_SHARE}
    assert served == {(r[c.INCIDENT_ID], r[c.PHASE]): r[c.EXCESS_S]
                      for r in stored.iter_rows(named=True)}
    assert shares == {(r[c.INCIDENT_ID], r[c.PHASE]): r[c.SHARE]
                      for r in stored.iter_rows(named=True) if r[c.SHARE] is not None}


def test_the_grafana_annotations_are_the_active_incidents_with_their_link(live: Live) -> None:
    server = prom(live)
    info = {dict(labels)[c.INCIDENT_ID]: dict(labels) for (n, labels) in scrape(live.url)
            if n == x.INCIDENT_INFO}
    (annotation,) = json.loads(BOARD.read_text())["annotations"]["list"]
    series = wait_for(lambda: server.query(promql(annotation["expr"])), "annotations", server)
    assert {s["metric"][c.INCIDENT_ID]: s["metric"][x.URL] for s in series} == {
        ident: labels[x.URL] for ident, labels in info.items()}
    assert '<a href="{{url}}">' in annotation["textFormat"]


def test_no_incident_open_is_zero_for_every_cause_not_nothing(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "data")
    write_tables(generate(FleetSpec(hosts=2, gpus_per_host=1, duration_s=1800, seed=3), []),
                 root)  # windows, never analysed: no incident at all
    with exporter(root, tmp_path) as url:
        got = scrape(url)
    by_cause = {dict(lab)[c.CAUSE]: v for (n, lab), v in got.items() if n == x.OPEN_INCIDENTS}
    assert by_cause == dict.fromkeys(CAUSES, 0.0)
    assert not [k for k in got if k[0] == x.INCIDENT_INFO]


def test_the_grafana_dashboard_queries_only_served_series() -> None:
    served = {x.J_PER_TOKEN, x.KV_CACHE_USAGE, x.WINDOW_END, x.OPEN_INCIDENTS,
              x.INCIDENT_INFO, "fleetlens_slo_error_budget_remaining_ratio",
              "fleetlens_slo_burn_rate"} | {f"{n}_total" for n in (
                  x.REQUESTS, x.REQUEST_ERRORS, x.INPUT_TOKENS, x.OUTPUT_TOKENS,
                  x.GPU_ENERGY)} | {f"{n}_bucket" for n in x.LATENCY_HISTOGRAMS.values()}
    used = {name for expr in board_queries()
            for name in re.findall(r"\bfleetlens_[a-z0-9_]+", expr)}
    assert used and used <= served, used - served
    assert {"fleetlens_ttft_seconds_bucket", x.INCIDENT_INFO, x.OPEN_INCIDENTS} <= used


def test_the_grafana_panels_have_unique_ids_units_in_titles_and_do_not_overlap() -> None:
    panels = json.loads(BOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = [(x0, y0) for p in panels for x0 in range(p["gridPos"]["x"],
                                                       p["gridPos"]["x"] + p["gridPos"]["w"])
             for y0 in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len(cells) == len(set(cells)), "two panels share grid cells"
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in panels)
    # the unit of every chart is in its title (issue 32: units in every chart title)
    assert all(re.search(r"\(.+\)", p["title"]) for p in panels), [p["title"] for p in panels]
