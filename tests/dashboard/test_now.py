"""Issue 32: the headlines that describe *now* read the newest minutes, and "active" is the
exporter's definition (:mod:`analytics.open_incidents`), not a page's own."""

from __future__ import annotations

import shutil

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.open_incidents import active_incidents, closed_until_ns
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan, write_parquet_atomic
from tests.dashboard.conftest import app_over
from tests.dashboard.test_pages import open_page

NS = 1_000_000_000


def test_kv_headroom_headline_is_the_last_minutes(app, demo_data) -> None:
    """The synthetic KV incident filled one instance's cache 72-87 min into a 2 h fleet: an
    hour later the headline reads the cache as it is, not the range's 1% headroom."""
    from fleetlens.analytics.kvcache import kv_summary

    root = demo_data[0]
    engine = scan(root, t.ENGINE_SAMPLES).collect()
    newest = engine[c.TS_NS].max()
    recent = engine.filter(pl.col(c.TS_NS) > newest - 5 * 60 * NS)
    gpus = dict(scan(root, t.GPU_SAMPLES).group_by(c.HOST_NAME).agg(
        pl.col(c.GPU_MODEL).first()).collect().iter_rows())
    mapping = scan(root, t.INSTANCE_GPUS).collect()
    now = kv_summary(recent, mapping, gpus, AnalyticsConfig())[c.KV_HEADROOM].min()
    whole = kv_summary(engine, mapping, gpus, AnalyticsConfig())[c.KV_HEADROOM].min()
    assert f"{100 * whole:.0f}%" != f"{100 * now:.0f}%"  # the incident is in the range
    open_page(app, "kv_cache")
    shown = next(m for m in app.metric if m.label.startswith("Least headroom")).value
    assert shown == f"{100 * now:.0f}%"


def _with_incidents(src: DataDir, dst: DataDir) -> tuple[pl.DataFrame, int]:
    """A copy of ``src`` with two more incidents: one ended 3 minutes before the end of the
    latest closed window, one still going at it."""
    shutil.copytree(src.root, dst.root)
    until = closed_until_ns(scan(dst, t.WINDOWS).collect())
    assert until is not None
    stored = scan(dst, t.INCIDENTS).collect()
    one = stored.head(1)
    more = pl.concat([
        one.with_columns(pl.lit("e" * 16).alias(c.INCIDENT_ID),
                         pl.lit(until - 20 * 60 * NS).alias(c.START_NS),
                         pl.lit(until - 3 * 60 * NS).alias(c.END_NS)),
        one.with_columns(pl.lit("f" * 16).alias(c.INCIDENT_ID),
                         pl.lit(until - 10 * 60 * NS).alias(c.START_NS),
                         pl.lit(until).alias(c.END_NS)),
    ])
    incidents = pl.concat([stored, more])
    for path in dst.table_dir(t.INCIDENTS).rglob("*.parquet"):
        path.unlink()
    write_parquet_atomic(incidents, dst.derived(t.INCIDENTS) / "part-0.parquet")
    return incidents, until


def test_active_incidents_are_the_exporters(demo_data, tmp_path, monkeypatch) -> None:
    """An incident that ended 3 minutes before the latest closed window is over for the
    exporter; the overview counted it active ("still open in the last 5 min")."""
    root = DataDir(tmp_path / "data")
    incidents, until = _with_incidents(demo_data[0], root)
    expected = active_incidents(incidents, until)
    assert expected[c.INCIDENT_ID].to_list() == ["f" * 16]
    app = app_over(root, monkeypatch)
    assert f"Active incidents: {expected.height}" in [h.value for h in app.subheader]


def test_a_calm_mixed_fleet_shows_no_red_latency_tile(tmp_path, monkeypatch) -> None:
    """A 70B beside an 8B-class model, both calm at the end: the p99 of their pooled
    requests against a request-weighted mean of their bands read red (+20% and more) on a
    calm fleet. Each tile is now one series' p99 against its own band."""
    from tests.dashboard.synth import Fleet, build_all

    root = DataDir(tmp_path / "mixed")
    build_all(root, Fleet(slow_model=4.0))
    app = app_over(root, monkeypatch)
    latency = [m for m in app.metric if m.label.split()[0] in ("TTFT", "TPOT", "E2E")]
    assert len(latency) == 24  # two services x two models, six tiles each
    # The p99s (pooled: E2E +56%, TTFT +44% on this fleet); a p50 without a band is judged
    # against the five windows before, whose noise (240 requests) is not this defect.
    for tile in (m for m in latency if m.label.endswith("p99")):
        assert tile.delta is None or float(tile.delta.rstrip("%")) < 15, (tile.label, tile.delta)
