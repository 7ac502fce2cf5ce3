"""A live ``fleetlens exporter`` process over a synthetic fleet that grows while it runs, and a
real Prometheus scraping it (tests/analytics/test_exporter*.py).

The fleet's first 2 h 50 min are analysed and served; once Prometheus has scraped (the
exporter's counters start then, at 0), the last 10 minutes arrive and are analysed too, so
the counters and histograms increase once, as they do when the pipeline runs.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.runner import run
from fleetlens.collector.testing import free_port
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.settings import load_section
from fleetlens.pipeline.storage import DataDir
from tests.analytics.promservers import Server, prometheus, wait_for
from tests.analytics.synthetic import FleetSpec, Injected, SynthData, generate
from tests.analytics.synthetic_io import write_tables
from tests.conftest import REPO

H = 3600
NS = 10**9
SPEC = FleetSpec(hosts=3, gpus_per_host=2, duration_s=3 * H, seed=11)
#: an incident still going at the end of the data
INJECTED = Injected("kv_cache_pressure", "host_name=h01", 3 * H - 1500, 1500)
CUT_NS = SPEC.start_ns + (3 * H - 600) * NS
DASHBOARD = "http://dashboard.example:8501"
#: fleetlens.toml of the analytics runs and the exporter: the incident links' base, and SLOs
#: so that the SLO families (and the dashboard's SLO panels) have data
CONFIG = f"""[analytics]
dashboard_url = "{DASHBOARD}"

[analytics.slos]
period_days = 3

[[analytics.slos.services]]
service = "chat"
availability = 0.999
latency = [{{metric = "ttft", threshold_s = 1.0, objective = 0.99}}]
"""
RULES = REPO / "deploy" / "prometheus" / "fleetlens-rules.yaml"


@dataclass
class Live:
    """The running exporter (``url``), what it serves from, and Prometheus (``prom``)."""

    root: DataDir
    data: SynthData
    url: str
    prom: Server | None = None
    #: start of the newest window when the exporter first read (its counters start there)
    first_newest_ns: int = 0


def part(data: SynthData, before: bool) -> SynthData:
    """The fleet's rows before ``CUT_NS`` (or from it on)."""
    def keep(frame: pl.DataFrame, ts: str) -> pl.DataFrame:
        return frame.filter((pl.col(ts) < CUT_NS) if before else (pl.col(ts) >= CUT_NS))
    return dataclasses.replace(
        data, requests=keep(data.requests, c.ARRIVAL_NS),
        windows=keep(data.windows, c.WINDOW_START_NS),
        engine_samples=keep(data.engine_samples, c.TS_NS),
        gpu_samples=keep(data.gpu_samples, c.TS_NS))


def scrape(url: str) -> dict[tuple, float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def families(url: str) -> dict[str, str]:
    """``/metrics``' family names -> their type."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


@contextmanager
def exporter(root: DataDir, folder: Path, *args: str) -> Iterator[str]:
    """``fleetlens exporter`` on a free port of 127.0.0.1 (every scrape reads the tables),
    stopped by its PID; yields its /metrics URL."""
    port = free_port()
    config = folder / "fleetlens.toml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    log_path = folder / "exporter.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "exporter", "--data-dir", str(root.root),
             "--config", str(config), "--port", str(port), "--refresh", "0", *args],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}/metrics"
    def answers() -> bool:
        assert proc.poll() is None, f"the exporter exited: {log_path.read_text()}"
        return bool(scrape(url))

    try:
        wait_for(answers, "the exporter to answer")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
    output = log_path.read_text()
    assert "serving http://127.0.0.1:" in output and "stopped" in output, output


def scrape_config(url: str, folder: Path) -> dict:
    """prometheus.yml: scrape the exporter every 3 s as job ``fleetlens`` (a read of the
    tables takes up to a second on a busy machine, and a scrape slower than its timeout
    makes every series stale), and evaluate deploy/prometheus/fleetlens-rules.yaml."""
    target = url.removeprefix("http://").removesuffix("/metrics")
    return {"global": {"scrape_interval": "3s", "scrape_timeout": "3s",
                       "evaluation_interval": "3s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "fleetlens",
                                "static_configs": [{"targets": [target]}]}]}


@contextmanager
def live_fleet(folder: Path, with_prometheus: bool = True) -> Iterator[Live]:
    """The growing fleet, its exporter and (``with_prometheus``) a Prometheus: see the module
    docstring. Yields once the last 10 minutes were analysed and scraped."""
    data = generate(SPEC, [INJECTED])
    root = DataDir(folder / "data")
    (folder / "slos.toml").write_text(CONFIG)
    config = load_section(AnalyticsConfig, "analytics", folder / "slos.toml", environ={})
    write_tables(part(data, before=True), root)
    run(root, config, notify=False)
    with exporter(root, folder) as url:  # its first read: the counters start
        live = Live(root, data, url, first_newest_ns=int(
            part(data, True).windows[c.WINDOW_START_NS].max()))
        with _maybe_prometheus(folder, url, with_prometheus) as prom:
            live.prom = prom
            if prom is not None:
                wait_for(lambda: prom.query("fleetlens_requests_total"), "a first scrape", prom)
            # requests before windows: a read in between counts nothing until both are there
            write_tables(part(data, before=False), root, name="later.parquet")
            run(root, config, notify=False)
            expected = expected_requests(live).height
            wait_for(lambda: sum(v for (n, _), v in scrape(url).items()
                                 if n == "fleetlens_requests_total") == expected,
                     "the exporter to count the last 10 minutes")
            if prom is not None:
                wait_for(lambda: [r for r in prom.query("sum(fleetlens_requests_total)")
                                  if float(r["value"][1]) == expected],
                         "Prometheus to scrape the counted requests", prom)
            yield live


@contextmanager
def _maybe_prometheus(folder: Path, url: str, wanted: bool) -> Iterator[Server | None]:
    if not wanted:
        yield None
        return
    with prometheus(folder / "prometheus", scrape_config(url, folder)) as prom:
        yield prom


def expected_requests(live: Live) -> pl.DataFrame:
    """The requests the exporter counts: arrived from its first read's newest window to the
    newest window now (which is still filling)."""
    newest = int(live.data.windows[c.WINDOW_START_NS].max())
    return live.data.requests.filter(
        pl.col(c.ARRIVAL_NS).is_between(live.first_newest_ns, newest, closed="left"))


__all__ = ["DASHBOARD", "Live", "expected_requests", "families", "live_fleet", "scrape"]
