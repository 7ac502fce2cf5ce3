"""The exporter reads recent windows only (issue 33, item 7): a refresh reads the partitions of
the last ``--lookback``, not the table's history, and a series silent longer than that is no
longer served, by the gauges nor by the counters, so the families stay bounded however many
series the fleet ever had."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from prometheus_client.core import Metric

from fleetlens.analytics.exporter import DerivedSignals
from fleetlens.pipeline.partitions import HOUR_NS, files_since, partition_file, partition_span
from fleetlens.pipeline.partitions import publish as publish_hour
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import exported as x
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.synthetic import FleetSpec, SynthData, generate

SPEC = FleetSpec(hosts=3, gpus_per_host=1, duration_s=4 * 3600, seed=5)
SILENT = "h02"  # stops reporting after the fleet's first hour


@pytest.fixture(scope="module")
def fleet() -> SynthData:
    return generate(SPEC, [])


def _publish(root: DataDir, data: SynthData, until_ns: int) -> None:
    """The windows and requests before ``until_ns`` into hour partitions, as the pipeline
    publishes them; the silent host only in the first hour."""
    first_hour_end = SPEC.start_ns + HOUR_NS
    for table, frame, ts in ((t.WINDOWS, data.windows, c.WINDOW_START_NS),
                             (t.REQUESTS, data.requests, c.ARRIVAL_NS)):
        frame = frame.filter(pl.col(ts) < until_ns, (pl.col(c.HOST_NAME) != SILENT)
                             | (pl.col(ts) < first_hour_end))
        hour = (pl.col(ts) // HOUR_NS) * HOUR_NS
        for (start,), part in frame.with_columns(hour.alias("_h")).group_by("_h"):
            publish_hour(root, table, int(start), part.drop("_h").sort(ts))


def _hosts(families: list[Metric], name: str) -> set[str]:
    family = next(f for f in families if f.name == name)
    return {s.labels[x.HOST] for s in family.samples}


def test_a_host_silent_longer_than_the_lookback_is_not_served(tmp_path: Path,
                                                              fleet: SynthData) -> None:
    root = DataDir(tmp_path)
    _publish(root, fleet, SPEC.start_ns + 3 * HOUR_NS)
    signals = DerivedSignals(root, refresh_s=0, lookback_s=3600)
    first = signals.read()
    assert SILENT not in _hosts(first, x.KV_CACHE_USAGE)
    assert _hosts(first, x.KV_CACHE_USAGE) == {"h00", "h01"}
    # the same data with a lookback that reaches the silent host's hour still serves it
    wide = DerivedSignals(root, refresh_s=0, lookback_s=3 * 3600).read()
    assert SILENT in _hosts(wide, x.KV_CACHE_USAGE)


def test_counters_drop_a_series_once_it_is_silent_past_the_lookback(
        tmp_path: Path, fleet: SynthData) -> None:
    root = DataDir(tmp_path)
    _publish(root, fleet, SPEC.start_ns + HOUR_NS + 600 * 10**9)  # the first 70 minutes
    signals = DerivedSignals(root, refresh_s=0, lookback_s=3600)
    assert SILENT in _hosts(signals.read(), x.REQUESTS)  # heard from 10 minutes ago
    _publish(root, fleet, SPEC.start_ns + 3 * HOUR_NS)
    later = signals.read()
    assert _hosts(later, x.REQUESTS) == {"h00", "h01"}
    # the hosts still reporting counted every request of the two hours between the reads
    counted = sum(s.value for f in later if f.name == x.REQUESTS for s in f.samples
                  if s.name == f"{x.REQUESTS}_total")
    first_newest = SPEC.start_ns + HOUR_NS + 540 * 10**9  # the newest window at the first read
    last_newest = int(fleet.windows[c.WINDOW_START_NS].filter(
        fleet.windows[c.WINDOW_START_NS] < SPEC.start_ns + 3 * HOUR_NS).max())
    expected = fleet.requests.filter(
        pl.col(c.HOST_NAME) != SILENT,
        pl.col(c.ARRIVAL_NS).is_between(first_newest, last_newest, closed="left")).height
    assert counted == expected > 0


def test_a_refresh_does_not_read_the_history(tmp_path: Path, fleet: SynthData) -> None:
    """An hour partition older than the lookback is not opened: a damaged one there does not
    break the scrape, where reading the whole table failed on it."""
    root = DataDir(tmp_path)
    _publish(root, fleet, SPEC.start_ns + 4 * HOUR_NS)
    old = partition_file(root, t.WINDOWS, SPEC.start_ns)
    old.write_bytes(b"not parquet")
    families = DerivedSignals(root, refresh_s=0, lookback_s=3600).read()
    assert _hosts(families, x.KV_CACHE_USAGE) == {"h00", "h01"}


def test_files_since_keeps_the_partitions_that_can_hold_later_rows(tmp_path: Path,
                                                                   fleet: SynthData) -> None:
    root = DataDir(tmp_path)
    _publish(root, fleet, SPEC.start_ns + 4 * HOUR_NS)
    cut = SPEC.start_ns + 2 * HOUR_NS + 1
    kept = files_since(root, t.WINDOWS, cut)
    assert [partition_span(f) for f in kept] == [
        (SPEC.start_ns + h * HOUR_NS, SPEC.start_ns + (h + 1) * HOUR_NS) for h in (2, 3)]
    day = root.partition_path(t.WINDOWS, date="2026-01-01") / "x.parquet"
    assert partition_span(day) == (SPEC.start_ns, SPEC.start_ns + 24 * HOUR_NS)
    assert partition_span(root.table_dir(t.WINDOWS) / "loose.parquet") is None
