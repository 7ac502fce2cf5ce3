"""Phase 1 in (host group x hour) shards gives the same files as one shard per hour, for any
shard size, on a random fleet with gateways on hosts of their own (a request's spans on two
hosts) and failed gateway requests (a value taken across requests)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from fleetlens.pipeline import phase2, phase2reduce, phases, rangemerge
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.discovery import discover
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.shards import Shard, plan, plan_hour, trace_bucket
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.pipeline.fleet import GATEWAYS, Fleet, make_fleet, with_gateways, write_batches
from tests.pipeline.rawdata import NS

HOSTS = 9
@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return with_gateways(make_fleet(seed=7, hosts=HOSTS, seconds=600, rps=1.5), HOSTS)


def _run(root: Path, fleet: Fleet, cfg: PipelineConfig) -> dict[str, str]:
    dd = DataDir(root)
    write_batches(dd, fleet)
    Pipeline(dd, cfg).run_once(full=True)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in OUTPUTS for p in parquet_files(dd.derived(table))}


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory, fleet) -> dict[str, str]:
    return _run(tmp_path_factory.mktemp("one") / "data", fleet, PipelineConfig())


@pytest.mark.parametrize(("per_shard", "reduce_rows"), [
    (1, 500), (2, PipelineConfig().reduce_rows), (2, 97), (7, 500),
    (HOSTS + len(GATEWAYS), 500)])
def test_any_shard_size_gives_the_same_files(tmp_path: Path, fleet, one_shard, per_shard,
                                             reduce_rows, monkeypatch) -> None:
    """Any shard size, and with several shards any size of the reduce's ranges (a few rows:
    many ranges of request_energy and of windows), gives the one-shard files."""
    seen: list[int] = []
    seen2: list[int] = []
    cuts: list[int] = []
    real, real2 = phases.phase1_spans, phase2.phase2_shard
    real_bounds, real_windows = rangemerge.range_bounds, phase2reduce.window_bounds

    def spy(cfg, files, hour, shard, mapping, rows=None, stage_to=None):
        seen.append(shard.count)
        return real(cfg, files, hour, shard, mapping, rows, stage_to)

    def spy2(dd, cfg, hour, dirty, shard, cache=None, stage_to=None):
        seen2.append(shard.count)
        return real2(dd, cfg, hour, dirty, shard, cache, stage_to)

    def bounds(*args):
        cuts.append(len(out := real_bounds(*args)))
        return out

    def windows(*args):
        cuts.append(len(out := real_windows(*args)))
        return out

    monkeypatch.setattr(phases, "phase1_spans", spy)
    monkeypatch.setattr(phase2, "phase2_shard", spy2)
    monkeypatch.setattr(rangemerge, "range_bounds", bounds)
    monkeypatch.setattr(phase2reduce, "window_bounds", windows)
    cfg = replace(PipelineConfig(), hosts_per_shard=per_shard, reduce_rows=reduce_rows)
    files = _run(tmp_path / "data", fleet, cfg)
    hosts = HOSTS + len(GATEWAYS)
    # both phases of the hours really ran in that many shards
    assert set(seen) == set(seen2) == {-(-hosts // per_shard)}
    # the reduce merged in ranges (request_energy and the fleet-wide windows) where asked
    if per_shard < hosts:
        assert (max(cuts) > 3) == (reduce_rows < 1000), cuts
    assert files == one_shard
    for table in ("requests", "request_energy", "gpu_window_energy", "windows"):
        assert any(f"/{table}/" in f"/{name}" for name in files), table
    assert not (tmp_path / "data" / "state" / "staging").exists() or not any(
        (tmp_path / "data" / "state" / "staging").iterdir())


def test_the_fleet_exercises_what_crosses_shards(one_shard, tmp_path: Path, fleet) -> None:
    """The failed gateway requests exist and took their engine's service, and gateway
    overhead was joined: the sweep above compares something."""
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    Pipeline(dd, replace(PipelineConfig(), hosts_per_shard=1)).run_once(full=True)
    requests = pl.read_parquet(list(parquet_files(dd.derived("requests"))))
    failed = requests.filter(pl.col(c.SOURCE) == "gateway")
    assert failed.height == HOSTS
    assert failed.get_column(c.SERVICE_NAME).unique().to_list() == ["chat"]
    assert requests.get_column(c.NETWORK_S).is_not_null().sum() > 100


def test_the_fleet_wide_windows_are_reduced_from_every_shard(one_shard, tmp_path: Path,
                                                             fleet) -> None:
    """The fleet-wide rows (host '*') sum the per-host rows of several shards: requests and
    energy exactly, power and the KV mean as the hosts' figures added up (so the sweep above
    compares reduced rows, not one shard's)."""
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    Pipeline(dd, replace(PipelineConfig(), hosts_per_shard=2)).run_once(full=True)
    rows = pl.read_parquet(list(parquet_files(dd.derived("windows"))))
    key = [c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL]
    star = pl.col(c.HOST_NAME) == "*"
    hosts = rows.filter(~star).group_by(key).agg(
        pl.col(c.REQUESTS).sum(), pl.col(c.ENERGY_J).sum().alias("energy"),
        pl.col(c.POWER_W).sum().alias("power"), pl.col(c.HOST_NAME).n_unique().alias("n"))
    both = rows.filter(star).join(hosts, on=key, how="inner")
    assert both.height > 10 and both.get_column("n").max() > 2
    assert (both.get_column(c.REQUESTS) == both.get_column("requests_right")).all()
    for fleet_col, host_col in ((c.ENERGY_J, "energy"), (c.POWER_W, "power")):
        diff = (both.get_column(fleet_col) - both.get_column(host_col)).abs()
        assert diff.max() < 1e-6 * both.get_column(fleet_col).abs().max()
    assert rows.filter(star).get_column(c.KV_CACHE_USAGE_MEAN).is_not_null().sum() > 5


def test_the_reduce_gives_the_same_bytes_in_any_shard_order(tmp_path: Path, fleet) -> None:
    """merge_phase2 of one hour's shard results in reverse order gives the same partitions:
    the fleet-wide floating-point sums add the hosts' partials in host order, not in the
    order the shards came back (a Ray reduce takes them as they finish)."""
    from fleetlens.pipeline.phase2 import merge_phase2, phase2_shard

    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    cfg = PipelineConfig()
    Pipeline(dd, cfg).run_once(full=True)
    state = PipelineState.load(dd)
    hour = max(h for h in {s.min_ns - s.min_ns % (3600 * NS) for s in state.segments.values()})
    shards = plan(list(state.watermarks), 2)
    forward = merge_phase2([phase2_shard(dd, cfg, hour, set(), s) for s in shards], 60, 10**9)
    backward = merge_phase2([phase2_shard(dd, cfg, hour, set(), s)
                             for s in reversed(shards)], 60, 10**9)
    whole = phases.phase2_hour(dd, cfg, hour, set())
    assert forward.windows.height > 20
    for out in (backward, whole):
        assert out.windows.equals(forward.windows)
        assert out.request_energy.equals(forward.request_energy)
        assert out.gpu_window_energy.equals(forward.gpu_window_energy)


def test_plan_covers_every_host_once() -> None:
    hosts = [f"h{i}" for i in range(10)]
    shards = plan(hosts, 3)
    assert [s.count for s in shards] == [4] * 4
    frame = pl.DataFrame({c.HOST_NAME: [*hosts, "new-host", None]})
    taken = [frame.filter(s.point_filter()).get_column(c.HOST_NAME).to_list() for s in shards]
    assert sorted(sum(taken, []), key=str) == sorted([*hosts, "new-host", None], key=str)
    assert taken[0] == ["h0", "h1", "h2"]
    assert plan(hosts, 10) == [Shard(0, 1)] and plan(hosts, 50) == [Shard(0, 1)]


def test_trace_bucket_depends_on_the_id_only() -> None:
    ids = pl.Series([f"{i:032x}" for i in range(1000)] + ["not-hex", "", "ab"])
    buckets = pl.select(trace_bucket(pl.lit(ids), 7)).to_series()
    assert buckets.min() == 0 and buckets.max() == 6
    assert buckets[-3:].to_list() == [0, 0, 0xab % 7]
    assert buckets.value_counts().get_column("count").min() > 100  # spread evenly


def test_shard_size_is_chosen_from_rows_per_host_hour() -> None:
    from fleetlens.pipeline.state import Segment

    hour = 0
    state = PipelineState(watermarks={f"h{i}": 0 for i in range(8)})
    # 8M rows in the hour over 8 hosts: 1M per host-hour
    state.segments["a"] = Segment("metrics", 1, hour, hour + 3600 * NS - 1, 8_000_000)
    cfg = replace(PipelineConfig(), shard_rows=3_000_000)
    assert [len(s.hosts) for s in plan_hour(state, cfg, hour)] == [3, 3, 6]  # last: the rest
    assert plan_hour(state, PipelineConfig(), hour) == [Shard(0, 1)]  # 8M rows: one shard
    # a segment half in the hour counts half
    state.segments["b"] = Segment("spans", 1, hour - 3600 * NS, hour + 3600 * NS - 1,
                                  12_000_000)
    assert len(plan_hour(state, PipelineConfig(), hour)) == 2


def test_shard_settings_are_validated() -> None:
    from fleetlens.pipeline.schema.settings import ConfigError

    for bad in ({"shard_rows": 0}, {"hosts_per_shard": -1}, {"split_from_shards": 1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            replace(PipelineConfig(), **bad).validate()


_KILLED_IN_A_SHARD = """
import os, signal, sys, time
from dataclasses import replace
from pathlib import Path
from fleetlens.pipeline import phase2, phase2reduce, phases, rangemerge
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.storage import DataDir
real = phases.phase1_spans
def dying(cfg, files, hour, shard, mapping, rows=None, stage_to=None):
    # The last shard of a later hour, mid-run, once the first hour (on the other phase-1
    # thread) is published.
    if hour > int(sys.argv[2]) and shard.index == shard.count - 1:
        for _ in range(3000):
            if any((Path(sys.argv[1]) / "derived" / "requests").rglob("*.parquet")):
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(cfg, files, hour, shard, mapping, rows, stage_to)
phases.phase1_spans = dying
Pipeline(DataDir(sys.argv[1]), replace(PipelineConfig(), hosts_per_shard=3)).run_once()
"""


def test_a_run_killed_in_a_shard_is_redone_and_the_files_are_the_same(
        tmp_path: Path, fleet, one_shard) -> None:
    """The local runner's process is SIGKILLed inside a shard's span half, after earlier
    hours were published: the next run (the state was never saved) redoes every hour and
    the files are the one-shard bytes."""
    import subprocess
    import sys

    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    repo = Path(__file__).resolve().parents[2]
    first = min(r[c.START_NS] for batch in fleet.span_batches for r in batch)
    died = subprocess.run([sys.executable, "-c", _KILLED_IN_A_SHARD, str(dd.root),
                           str(first - first % (3600 * NS))],
                          cwd=repo, capture_output=True, text=True, timeout=300)
    assert died.returncode == -9, died.stderr[-2000:]
    assert not (dd.root / "state" / "pipeline.json").exists()
    assert any(parquet_files(dd.derived("requests"))), "killed before any hour was published"
    # the killed run left its staged pieces (the point halves of that hour ran)
    assert any((dd.root / "state" / "staging").rglob("*.parquet"))
    Pipeline(dd, replace(PipelineConfig(), hosts_per_shard=3)).run_once()
    files = {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
             for table in OUTPUTS for p in parquet_files(dd.derived(table))}
    assert files == one_shard
    # and the next run removed them; nothing half-written is left beside a partition
    assert not list((dd.root / "state" / "staging").rglob("*"))
    assert not list((dd.root / "derived").rglob("*.tmp"))


def test_the_merge_drops_the_pieces_it_merged(tmp_path: Path, fleet) -> None:
    """merge_phase1 empties the lists of halves it is given (the local runner's thread passes
    the only references, so each table's pieces are freed once merged) and returns what the
    halves merged gave before, also merged in memory in ranges of a few hundred rows (as on
    an object store, where nothing is staged)."""
    from fleetlens.pipeline.shardreduce import merge_by_host, merge_phase1

    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    state, cfg = PipelineState(), PipelineConfig()
    discover(dd, state, int(cfg.max_sample_gap_s * NS), cfg.lateness_s * NS)
    hour = max(h for h in {s.min_ns - s.min_ns % (3600 * NS) for s in state.segments.values()})
    files = phases.phase1_files(state, dd, cfg, hour)
    shards = plan(list(state.watermarks), 4)
    points = [phases.phase1_points(cfg, files, hour, s) for s in shards]
    mapping = merge_by_host([p.mapping for p in points])
    spans = [phases.phase1_spans(cfg, files, hour, s, mapping) for s in shards]
    merged = merge_phase1(points, spans, 300)
    assert points == [] and spans == []
    whole = phases.phase1_hour(cfg, files, hour)
    assert [name for name, _ in merged] == [name for name, _ in whole]
    for (_, got), (_, want) in zip(merged, whole, strict=True):
        assert got.equals(want)


def test_fleet_partials_add_up_in_host_order_whatever_order_they_come_in() -> None:
    """Floating-point addition is not associative: hosts' partials whose sum depends on the
    order (1e16 + 1 - 1e16) give the fleet-wide figure of host order, from any shard order."""
    from fleetlens.pipeline.energy import SHARE, fleet_group_energy
    from fleetlens.pipeline.windows import engine_host_stats, fleet_engine_stats

    hosts, values = ["a", "b", "c"], [1e16, 1.0, -1e16]
    energy = pl.DataFrame({c.WINDOW_START_NS: [0] * 3, c.SERVICE_NAME: ["s"] * 3,
                           c.MODEL: ["m"] * 3, c.HOST_NAME: hosts, SHARE: [1, 2, 3],
                           c.POWER_W: values})
    engine = pl.DataFrame({c.TS_NS: [1, 2, 3], c.HOST_NAME: hosts, c.INSTANCE_ID: ["i"] * 3,
                           c.MODEL: ["m"] * 3, c.KV_CACHE_USAGE: values,
                           c.PREFIX_CACHE_HITS_TOTAL: [1.0] * 3,
                           c.PREFIX_CACHE_QUERIES_TOTAL: [2.0] * 3,
                           c.PREEMPTIONS_TOTAL: [None] * 3},
                          schema_overrides={c.PREEMPTIONS_TOTAL: pl.Float64})
    stats = engine_host_stats(engine, 60)
    want_power = fleet_group_energy(energy).get_column(c.POWER_W).to_list()
    want_kv = fleet_engine_stats(stats).get_column("__kv_sum").to_list()
    assert want_power == [0.0] and want_kv == [0.0]  # (1e16 + 1) - 1e16, in host order
    for order in ([2, 1, 0], [1, 2, 0], [0, 2, 1]):
        shuffled = energy[order]
        assert fleet_group_energy(shuffled).get_column(c.POWER_W).to_list() == want_power
        got = fleet_engine_stats(stats.sort(c.HOST_NAME)[order])
        assert got.get_column("__kv_sum").to_list() == want_kv


def test_fleet_request_figures_from_shard_lists_equal_those_of_every_request() -> None:
    """The fleet-wide counts, sums and exact percentiles reduced from per-host-group lists
    (fleet_requests) equal one group-by over every request, nulls, hostless requests and a
    group without any latency included."""
    import random

    from fleetlens.pipeline.windows import _LATENCY_COLUMNS, fleet_request_aggregates
    from fleetlens.pipeline.windows import fleet_requests as partials

    rng = random.Random(4)
    n = 3000

    def latency() -> float | None:
        return None if rng.random() < 0.2 else rng.lognormvariate(-2, 1)

    requests = pl.DataFrame({
        c.ARRIVAL_NS: [rng.randrange(0, 300 * NS) for _ in range(n)],
        c.SERVICE_NAME: [rng.choice(["a", "b"]) for _ in range(n)],
        c.MODEL: [rng.choice(["m", None]) for _ in range(n)],
        c.HOST_NAME: [rng.choice(["h1", "h2", "h3", "h4", None]) for _ in range(n)],
        c.INPUT_TOKENS: [rng.choice([None, rng.randrange(1, 500)]) for _ in range(n)],
        c.OUTPUT_TOKENS: [rng.randrange(0, 300) for _ in range(n)],
        c.IS_ERROR: [rng.random() < 0.1 for _ in range(n)],
        **{col: [latency() for _ in range(n)] for col in _LATENCY_COLUMNS.values()}})
    # a window whose requests have no TTFT at all
    requests = requests.with_columns(
        pl.when(pl.col(c.ARRIVAL_NS) < 60 * NS).then(None).otherwise(pl.col(c.TTFT_S))
        .alias(c.TTFT_S))
    hosts = pl.col(c.HOST_NAME)
    shards = [requests.filter(hosts.is_in(["h3", "h1"])), requests.filter(hosts == "h2"),
              requests.filter(hosts.is_null() | (hosts == "h4"))]
    got = fleet_request_aggregates(pl.concat([partials(s, 60) for s in reversed(shards)]), 60)
    want = fleet_request_aggregates(partials(requests, 60), 60)
    key = [c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL, c.REQUESTS]
    assert got.sort(key, nulls_last=True).equals(want.sort(key, nulls_last=True))
    # ... and the figures are those of every request at once
    window = (pl.col(c.ARRIVAL_NS) - pl.col(c.ARRIVAL_NS).mod(60 * NS)).alias(c.WINDOW_START_NS)
    direct = requests.group_by(window, c.SERVICE_NAME, c.MODEL).agg(
        pl.len().cast(pl.Int64).alias(c.REQUESTS), pl.col(c.INPUT_TOKENS).sum(),
        pl.col(c.TTFT_S).quantile(0.9, interpolation="linear").alias("ttft_p90_s"),
        pl.col(c.E2E_S).quantile(0.99, interpolation="linear").alias("e2e_p99_s"))
    # the fleet row of a group has more requests than its hostless row
    fleet = got.filter(pl.col(c.REQUESTS) == pl.col(c.REQUESTS).max().over(key[:3]))
    cols = list(direct.columns)
    assert fleet.height == direct.height > 5
    fleet, direct = (f.select(cols).sort(cols[:3], nulls_last=True) for f in (fleet, direct))
    assert fleet.select(cols[:5]).equals(direct.select(cols[:5]))
    # the same ranks; the interpolation of a list's quantile may round the last bit otherwise
    for col in cols[5:]:
        assert fleet[col].is_null().equals(direct[col].is_null())
        assert ((fleet[col] - direct[col]).abs() <= 1e-12 * direct[col].abs()).all()
    assert got.get_column("ttft_p90_s").null_count() > 0  # the window without any TTFT
