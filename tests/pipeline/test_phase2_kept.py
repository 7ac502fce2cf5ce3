"""Which hosts phase 2 of an hour keeps (pipeline/phase2kept.py): those none of whose inputs
this run rewrote, in any hour the hour's phase 2 reads, where the last run saved the hour's
energy partial; and that partial's life (saved, expired with the raw data)."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from fleetlens.pipeline import phase2kept
from fleetlens.pipeline.compact import compact
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.partitions import HOUR_NS, publish
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir

CFG = PipelineConfig()  # max_request_s = 3600: phase 2 reads back 3 hours, on 2 (+ gap)
HOUR = 500_000 * HOUR_NS


def _groups(hosts: list[str]) -> bytes | None:
    return phase2kept.groups_bytes(pl.DataFrame({c.WINDOW_START_NS: [HOUR] * len(hosts),
                                                 c.HOST_NAME: hosts}))


def test_a_host_is_dirty_where_this_run_rewrote_it_in_an_hour_phase_2_reads() -> None:
    def dirty(rewritten, pending=frozenset()):
        return phase2kept.dirty_hosts(PipelineState(), CFG, HOUR, rewritten, set(pending))

    assert dirty({}) == set()
    assert dirty({HOUR: {"a"}, HOUR + HOUR_NS: {"b"}, HOUR - HOUR_NS: set()}) == {"a", "b"}
    # requests still running started up to two lookbacks (and an hour) before; they end at
    # most max_request_s after the hour, whose slots read one more sample gap
    assert dirty({HOUR - 3 * HOUR_NS: {"a"}, HOUR + 2 * HOUR_NS: {"b"}}) == {"a", "b"}
    assert dirty({HOUR - 4 * HOUR_NS: None, HOUR + 3 * HOUR_NS: None}) == set()
    assert dirty({HOUR: {"a"}, HOUR + 2 * HOUR_NS: None}) is None  # every host, or requests
    assert dirty({HOUR: {"a"}}, pending={HOUR}) is None  # a dead run's hour
    longer = replace(CFG, max_request_s=3 * 3600)
    assert phase2kept.dirty_hosts(PipelineState(), longer, HOUR,
                                  {HOUR - 6 * HOUR_NS: None}, set()) is None


def test_the_plan_keeps_clean_hosts_where_the_energy_partial_was_saved(tmp_path) -> None:
    dd = DataDir(tmp_path)
    state = PipelineState(watermarks={h: HOUR for h in ["a", "b", "c", "d", "e", "*"]})
    cfg = replace(CFG, hosts_per_shard=2)
    assert phase2kept.plan_kept(dd, state, cfg, HOUR, {"b"}) is None  # nothing saved
    phase2kept.save_groups(dd, HOUR, _groups(["a", "b"]))
    assert phase2kept.plan_kept(dd, state, cfg, HOUR, None) is None
    assert phase2kept.plan_kept(dd, state, cfg, HOUR, {"a", "b", "c", "d", "e", "*"}) is None
    plan = phase2kept.plan_kept(dd, state, cfg, HOUR, {"b", "x"})
    assert [(s.index, s.count, s.hosts, s.rest, s.kept) for s in plan] == [
        (0, 3, ("a", "c"), False, True), (1, 3, ("d", "e"), False, True),
        # the dirty hosts' shard also takes hosts no shard names and requests naming none
        (2, 3, ("a", "c", "d", "e"), True, False)]
    # the first kept shard reads every kept host's published rows, once
    assert [s.kept_rows for s in plan] == [("a", "c", "d", "e"), (), ()]
    hosts = pl.DataFrame({c.HOST_NAME: ["a", "b", "d", "x", "*", None]})
    assert [hosts.filter(s.point_filter()).get_column(c.HOST_NAME).to_list()
            for s in plan] == [["a"], ["d"], ["b", "x", "*", None]]
    only_clean = phase2kept.plan_kept(dd, state, cfg, HOUR, set())
    assert only_clean[-1].hosts == ("a", "b", "c", "d", "e") and only_clean[-1].rest


def test_the_energy_partial_expires_with_the_raw_data(tmp_path) -> None:
    dd = DataDir(tmp_path)
    old, young = HOUR, HOUR + 30 * 24 * HOUR_NS
    for hour in (old, young):
        phase2kept.save_groups(dd, hour, _groups(["a"]))
    phase2kept.save_groups(dd, young + HOUR_NS, _groups([]))  # nothing: no file
    cfg = replace(CFG, raw_retention_days=7)
    compact(dd, cfg, now_ns=young + 2 * HOUR_NS, dry_run=True)
    assert phase2kept.groups_file(dd, old).exists()
    compact(dd, cfg, now_ns=young + 2 * HOUR_NS)
    assert not phase2kept.groups_file(dd, old).exists()
    assert phase2kept.groups_file(dd, young).exists()
    assert not phase2kept.groups_file(dd, young + HOUR_NS).exists()


def test_the_pending_hours_outlive_only_a_run_that_died(tmp_path) -> None:
    dd = DataDir(tmp_path)
    assert phase2kept.pending_hours(dd) == set()
    phase2kept.mark_pending(dd, {HOUR, HOUR + HOUR_NS})
    assert phase2kept.pending_hours(dd) == {HOUR, HOUR + HOUR_NS}
    phase2kept.clear_pending(dd)
    assert phase2kept.pending_hours(dd) == set()


def test_a_remodelled_instance_dirties_every_host_owning_its_requests(tmp_path) -> None:
    """Late labels of host a's engine named a model for instance i0: the requests naming i0
    changed, host c's as well (instance ids need not be unique across hosts)."""
    dd = DataDir(tmp_path)
    publish(dd, t.INSTANCE_GPUS, HOUR, pl.DataFrame(
        {c.HOST_NAME: ["a", "a", "b"], c.INSTANCE_ID: ["i0", "i1", "i9"]}))
    publish(dd, t.REQUESTS, HOUR, pl.DataFrame(
        {c.HOST_NAME: ["c", "b", "d", None], c.INSTANCE_ID: ["i0", "i9", "i5", "i1"]}))
    assert phase2kept.remodelled_hosts(dd, HOUR, frozenset({"a"})) == {"a", "c"}
    assert phase2kept.remodelled_hosts(dd, HOUR, frozenset({"b"})) == {"b"}
