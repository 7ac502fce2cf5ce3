"""`fleetlens exporter`, scraped over HTTP as Prometheus scrapes it: the series equal the
latest closed windows and the open incidents in the tables, and the Grafana dashboard only
queries series the exporter serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.runner import read_table, run
from fleetlens.collector.testing import free_port
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan, write_parquet_atomic
from tests.analytics.synthetic import FleetSpec, Injected, generate
from tests.analytics.synthetic_io import write_tables
from tests.conftest import REPO

H = 3600
NS = 10**9


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    root = DataDir(tmp_path_factory.mktemp("exporter") / "data")
    # an incident still going at the end of the data
    data = generate(FleetSpec(hosts=3, gpus_per_host=2, duration_s=3 * H, seed=11), [
        Injected("kv_cache_pressure", "host_name=h01", 3 * H - 1500, 1500)])
    write_tables(data, root)
    run(root, AnalyticsConfig(), notify=False)
    # and one long over, beside it in the table (not left to the detector's judgement)
    incidents = read_table(root, t.INCIDENTS)
    assert incidents.height >= 1
    closed = incidents.head(1).with_columns(
        pl.lit("0000closed000000").alias(c.INCIDENT_ID),
        (pl.col(c.START_NS) - 2 * H * NS).alias(c.START_NS),
        (pl.col(c.START_NS) - 2 * H * NS + 600 * NS).alias(c.END_NS))
    write_parquet_atomic(closed, root.table_dir(t.INCIDENTS) / "closed.parquet")
    return root


def scrape(url: str, attempts: int = 100) -> dict[tuple, float]:
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                text = resp.read().decode()
            break
        except OSError:
            time.sleep(0.2)
    else:
        raise AssertionError(f"{url} never answered")
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_exporter_serves_the_latest_closed_windows_and_open_incidents(analysed: DataDir,
                                                                       tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    log = open(tmp_path / "exporter.log", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "fleetlens", "exporter", "--data-dir",
                             str(analysed.root), "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        got = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log.seek(0)
        output = log.read()
        log.close()
    assert "serving http://127.0.0.1:" in output and "stopped" in output

    # the expectation, computed here from the table the pipeline wrote
    windows = scan(analysed, t.WINDOWS).collect()
    newest = windows[c.WINDOW_START_NS].max()
    latest = (windows.filter(pl.col(c.WINDOW_START_NS) < newest)
              .sort(c.WINDOW_START_NS).group_by(c.SERVICE_NAME, c.MODEL, c.HOST_NAME).last())
    assert latest.height >= 4  # 3 hosts and the fleet-wide row
    for row in latest.iter_rows(named=True):
        labels = (("host", row[c.HOST_NAME]), ("model", row[c.MODEL]),
                  ("service", row[c.SERVICE_NAME]))
        assert got[("fleetlens_requests_per_second", labels)] == pytest.approx(row[c.RPS])
        p99 = (*labels[:1], *labels[1:2], ("quantile", "0.99"), *labels[2:])
        assert got[("fleetlens_ttft_seconds", p99)] == pytest.approx(
            row[c.percentile_column("ttft", "p99")])
        end = (row[c.WINDOW_START_NS] + row[c.WINDOW_S] * NS) / NS
        assert got[("fleetlens_window_end_timestamp_seconds", labels)] == end
    # the newest window is still filling: never reported
    assert max(v for (n, _), v in got.items()
               if n == "fleetlens_window_end_timestamp_seconds") == newest / NS

    incidents, causes = read_table(analysed, t.INCIDENTS), read_table(analysed, t.CAUSES)
    now_ns = newest
    open_ids = set(incidents.filter(pl.col(c.END_NS) >= now_ns)[c.INCIDENT_ID])
    assert open_ids, "the incident injected at the end should still be open"
    assert "0000closed000000" not in open_ids  # the one long over is not served
    served = sum(v for (n, _), v in got.items() if n == "fleetlens_open_incidents")
    assert served == len(open_ids)
    top = causes.filter(pl.col(c.RANK) == 1, pl.col(c.INCIDENT_ID).is_in(list(open_ids)))
    served_causes = {dict(lab)["cause"] for (n, lab) in got if n == "fleetlens_open_incidents"}
    assert served_causes == set(top[c.CAUSE])


def test_the_grafana_dashboard_queries_only_served_series() -> None:
    from fleetlens.analytics.exporter import LATENCIES, SCALARS

    served = {name for name, _ in SCALARS.values()} | {
        f"fleetlens_{m}_seconds" for m in LATENCIES} | {
        "fleetlens_open_incidents", "fleetlens_window_end_timestamp_seconds"}
    board = json.loads((REPO / "deploy" / "grafana" / "fleetlens.json").read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 6
    import re

    used = {name for expr in exprs for name in re.findall(r"\bfleetlens_[a-z0-9_]+", expr)}
    assert used and used <= served, used - served
    assert {"fleetlens_ttft_seconds", "fleetlens_open_incidents"} <= used
