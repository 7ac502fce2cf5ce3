"""``fleetlens analyze --runner ray`` on a real two-node Ray cluster on 127.0.0.1: incident
attribution and Prophet fits in Ray tasks publish what the local runner publishes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.prophet_baselines import fit_prophet
from fleetlens.analytics.runner import read_table, run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.analytics.synthetic import FleetSpec, Injected, generate
from tests.analytics.synthetic_io import write_tables
from tests.pipeline.raycluster import connected_cluster, ray_env

REPO = Path(__file__).resolve().parents[2]
H = 3600
NS = 1_000_000_000
ANALYTICS_TABLES = (t.BASELINES, t.INCIDENTS, t.CAUSES)


@pytest.fixture(scope="module")
def cluster():
    with connected_cluster() as nodes:
        yield nodes


def _digest(dd: DataDir) -> dict[str, str]:
    return {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in ANALYTICS_TABLES for p in parquet_files(dd.table_dir(table))}


@pytest.mark.slow
def test_cli_analyze_on_ray_publishes_the_local_tables(tmp_path, cluster) -> None:
    """Two faults on two hosts: `fleetlens analyze --runner ray` (its own driver process)
    publishes baselines, incidents and causes byte-identical to a local run."""
    local = DataDir(tmp_path / "local")
    data = generate(FleetSpec(hosts=3, gpus_per_host=2, duration_s=3 * H, seed=5), [
        Injected("kv_cache_pressure", "host_name=h01", 2 * H, 900),
        Injected("slow_gpu", "host_name=h02", 1 * H, 900)])
    write_tables(data, local)
    remote = DataDir(tmp_path / "ray")
    shutil.copytree(local.root, remote.root)
    run(local, AnalyticsConfig(), notify=False)
    ran = subprocess.run(
        [sys.executable, "-m", "fleetlens", "analyze", "--data-dir", str(remote.root),
         "--runner", "ray", "--ray-address", cluster.address],
        capture_output=True, text=True, env=ray_env(), cwd=REPO, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    incidents = read_table(remote, t.INCIDENTS)
    assert incidents.height >= 2
    assert set(read_table(remote, t.CAUSES)[c.INCIDENT_ID]) == set(incidents[c.INCIDENT_ID])
    # stdout: one JSON line per new incident, as locally
    assert len([json.loads(line) for line in ran.stdout.splitlines()]) == incidents.height
    assert _digest(remote) == _digest(local)


def _daily(series: str, seed: int, days: float = 2.5) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    t0 = 1_767_225_600 * NS
    ts = np.arange(0, int(days * 86400), 60) * NS + t0
    values = 1.0 + 0.5 * np.sin(2 * np.pi * (ts - t0) / NS / 86400) + rng.normal(0, 0.02, len(ts))
    return pl.DataFrame({c.SERIES: series, c.TS_NS: ts, c.VALUE: values})


@pytest.mark.slow
def test_prophet_fits_in_ray_tasks_equal_local_fits(cluster) -> None:
    """Prophet fitted in Ray tasks gives the same baselines as fitted in this process (the
    band from residuals: Prophet's sampled intervals are random even locally)."""
    from fleetlens.analytics.ray_tasks import RayAnalytics

    cfg = dataclasses.replace(AnalyticsConfig(), prophet_refit_s=3600,
                              prophet_uncertainty_samples=0, prophet_workers=2)
    frame = pl.concat([_daily("a", 0), _daily("b", 1), _daily("c", 2)])
    here = fit_prophet(frame, cfg, workers=1)
    there = fit_prophet(frame, cfg, map_chunks=RayAnalytics(cluster.address).map_chunks)
    assert set(here[c.SERIES]) == {"a", "b", "c"}
    assert_frame_equal(there, here)


def test_analyze_ray_address_without_runner_ray_is_a_usage_error(tmp_path) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "fleetlens", "analyze", "--data-dir", str(tmp_path),
         "--ray-address", "127.0.0.1:1"], capture_output=True, text=True, cwd=REPO,
        timeout=120)
    assert ran.returncode == 2 and "--ray-address needs --runner ray" in ran.stderr
