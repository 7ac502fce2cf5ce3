"""Provisional live incidents through ``fleetlens analyze`` and real receivers on 127.0.0.1
(issue 30 item 6): a queue on the engines' gauges is posted before the span-based incident
exists, then that incident arrives as an update of the same post (native, PagerDuty and
Alertmanager alike), or the provisional one is withdrawn; `incidents` never holds one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.runner import read_table
from fleetlens.analytics.webhook_formats import (
    PROVISIONAL_DETECTOR,
    STATUS_CONFIRMED,
    STATUS_PROVISIONAL,
    STATUS_WITHDRAWN,
    UPDATE_TYPE,
)
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.synthetic import SynthData, generate
from tests.analytics.synthetic_io import write_tables
from tests.analytics.webhook_receiver import INJECTED, SPEC, H, config_file, serve, until

#: The webhook fleet (h01's KV cache fills from 2:00 to 2:15) scraped every second, as the
#: agent does: the gauges show the queue from the incident's first seconds.
LIVE = dataclasses.replace(SPEC, sample_s=1)
KEY = "R0123456789abcdef"


@pytest.fixture(scope="module")
def live() -> SynthData:
    return generate(LIVE, [INJECTED])


def analyze(root: DataDir, cfg: Path) -> None:
    out = CliRunner().invoke(cli, ["analyze", "--data-dir", str(root.root), "--config",
                                   str(cfg)])
    assert out.exit_code == 0 and "webhook failed" not in out.output, out.output


def hooks(rec, extra: str = "") -> str:  # noqa: ANN001 - webhook_receiver.Receiver
    """Native, PagerDuty, Alertmanager and Slack hooks on ``rec``, and ``extra``
    ``[analytics.provisional]`` settings. The synthetic engines' token counters step at
    each arrival (no decode model): the decode rule is off unless a test models one."""
    return (f'webhooks = ["{rec.url("/native")}", '
            f'{{url = "{rec.url("/pd")}", format = "pagerduty", routing_key = "{KEY}"}}, '
            f'{{url = "{rec.url("/am")}", format = "alertmanager"}}, '
            f'{{url = "{rec.url("/slack")}", format = "slack"}}]\n'
            f'[analytics.provisional]\ndecode_ratio = 0\n{extra}')


def bodies(rec, path: str) -> list:  # noqa: ANN001
    return [r.json() for r in rec.posts() if r.path == path]


def test_a_queue_is_posted_provisionally_then_updated_to_its_confirmed_incident(
        tmp_path: Path, live: SynthData) -> None:
    root = DataDir(tmp_path / "data")
    write_tables(until(live, 2 * H + 30), root)  # 30 s into the KV incident: no span says so
    with serve() as rec:
        cfg = config_file(tmp_path, hooks(rec))
        analyze(root, cfg)
        (first,) = bodies(rec, "/native")
        assert first["type"] == "fleetlens.incident" and first["status"] == STATUS_PROVISIONAL
        prov = first["incident"]
        assert prov[c.DETECTOR] == PROVISIONAL_DETECTOR and prov[c.HOST_NAME] == "h01"
        assert prov[c.START_NS] >= LIVE.start_ns + 2 * H  # the queue's first second
        assert (first["causes"][0][c.CAUSE], first["causes"][0][c.SUBJECT]) == (
            "kv_cache_pressure", "host_name=h01")
        # the batch tables never hold a provisional incident
        assert read_table(root, t.INCIDENTS).filter(
            pl.col(c.DETECTOR) == PROVISIONAL_DETECTOR).height == 0
        (pd_first,) = bodies(rec, "/pd")
        assert (pd_first["event_action"], pd_first["dedup_key"]) == ("trigger",
                                                                      prov[c.INCIDENT_ID])
        (am_first,) = bodies(rec, "/am")
        assert am_first[0]["annotations"]["status"] == STATUS_PROVISIONAL

        write_tables(until(live, 2 * H + 600), root)  # 10 minutes in: the spans have it
        analyze(root, cfg)
        confirmed = read_table(root, t.INCIDENTS).filter(
            (pl.col(c.HOST_NAME) == "h01") & (pl.col(c.START_NS) >= LIVE.start_ns + 2 * H - 120
                                              * 10**9))
        assert confirmed.height >= 1, confirmed
        first_id = confirmed.sort(c.START_NS)[c.INCIDENT_ID][0]
        native = bodies(rec, "/native")
        assert len(native) == 2  # one update, not a second page
        update = native[1]
        assert update["type"] == UPDATE_TYPE and update["status"] == STATUS_CONFIRMED
        assert update["incident_id"] == prov[c.INCIDENT_ID]
        assert update["incident"][c.INCIDENT_ID] == first_id
        assert update["causes"][0][c.CAUSE] == "kv_cache_pressure"
        assert update["provisional"] == first
        pd_update = bodies(rec, "/pd")[1]  # PagerDuty: the same alert, updated
        assert (pd_update["event_action"], pd_update["dedup_key"]) == ("trigger",
                                                                        prov[c.INCIDENT_ID])
        (alert,) = bodies(rec, "/am")[1]  # Alertmanager: the same labels, new annotations
        assert alert["labels"] == am_first[0]["labels"]
        assert alert["annotations"]["status"] == STATUS_CONFIRMED
        assert alert["annotations"]["confirmed_incident_id"] == first_id
        slack = [b["text"] for b in bodies(rec, "/slack")]
        assert len(slack) == 2 and "PROVISIONAL" in slack[0]
        assert "confirmed: " in slack[1] and "kv_cache_pressure" in slack[1]
        analyze(root, cfg)  # nothing new: no repost of either
        assert len(bodies(rec, "/native")) == 2 and len(bodies(rec, "/pd")) == 2


def _queue_only(data: SynthData, host: str, start_s: int, seconds: int) -> SynthData:
    """``data`` with ``seconds`` of 30 waiting requests on ``host``'s engines from
    ``start_s``, and nothing else: no request got slower (a queue nothing confirms)."""
    lo = LIVE.start_ns + start_s * 10**9
    hit = ((pl.col(c.HOST_NAME) == host)
           & pl.col(c.TS_NS).is_between(lo, lo + seconds * 10**9, closed="left"))
    engine = data.engine_samples.with_columns(
        pl.when(hit).then(30.0).otherwise(pl.col(c.NUM_WAITING)).alias(c.NUM_WAITING))
    return dataclasses.replace(data, engine_samples=engine)


def test_a_queue_nothing_confirms_is_withdrawn(tmp_path: Path, live: SynthData) -> None:
    data = _queue_only(live, "h02", H, 40)
    root = DataDir(tmp_path / "data")
    write_tables(until(data, H + 30), root)
    with serve() as rec:
        cfg = config_file(tmp_path, hooks(rec, "confirm_within_windows = 3"))
        analyze(root, cfg)
        (first,) = bodies(rec, "/native")
        assert first["status"] == STATUS_PROVISIONAL
        assert first["causes"] == []  # no more work, room in the cache: not known yet
        assert "not known yet" in bodies(rec, "/am")[0][0]["annotations"]["summary"]
        ident = first["incident"][c.INCIDENT_ID]
        write_tables(until(data, H + 200), root)  # 3 windows later: still nothing
        analyze(root, cfg)
        withdrawn = bodies(rec, "/native")[1]
        assert (withdrawn["type"], withdrawn["status"], withdrawn["incident_id"]) == (
            UPDATE_TYPE, STATUS_WITHDRAWN, ident)
        assert [(b["event_action"], b["dedup_key"]) for b in bodies(rec, "/pd")] == [
            ("trigger", ident), ("resolve", ident)]
        (resolved,) = bodies(rec, "/am")[-1]
        assert resolved["labels"][c.INCIDENT_ID] == ident and "endsAt" in resolved
        assert "withdrawn" in bodies(rec, "/slack")[1]["text"]
        analyze(root, cfg)  # withdrawn stays withdrawn: the same queue opens nothing again
        assert len(bodies(rec, "/native")) == 2 and len(bodies(rec, "/pd")) == 2


def test_a_short_blip_opens_nothing_and_the_setting_turns_it_off(tmp_path: Path,
                                                                  live: SynthData) -> None:
    root = DataDir(tmp_path / "data")
    write_tables(until(_queue_only(live, "h02", H, 3), H + 30), root)
    with serve() as rec:
        analyze(root, config_file(tmp_path, hooks(rec)))  # 3 s of queue: under hold_s
        assert rec.posts() == []
        write_tables(until(live, 2 * H + 30), root)
        analyze(root, config_file(tmp_path, hooks(rec, "enabled = false")))
        assert rec.posts() == []
        analyze(root, config_file(tmp_path, hooks(rec)))  # on again: the KV queue is posted
        (posted,) = bodies(rec, "/native")
        assert posted["status"] == STATUS_PROVISIONAL


@pytest.mark.parametrize("text,field", [
    ("min_waiting = 0", "analytics.provisional.min_waiting"),
    ("kv_full = 1.5", "analytics.provisional.kv_full"),
    ("severity = \"warning\"", "analytics.provisional.severity"),
    ("lookback_s = 2", "analytics.provisional.lookback_s"),
    ("confirm_within_windows = 0", "analytics.provisional.confirm_within_windows"),
    ("decode_ratio = 0.9", "analytics.provisional.decode_ratio"),
])
def test_bad_settings_name_their_field(tmp_path: Path, text: str, field: str) -> None:
    cfg = config_file(tmp_path, f"[analytics.provisional]\n{text}")
    out = CliRunner().invoke(cli, ["config", "check", str(cfg)])
    assert out.exit_code == 1 and field in out.output, out.output


def _hung(data: SynthData, instance: str, start_s: int, seconds: int) -> SynthData:
    """``instance`` stops computing from ``start_s`` for ``seconds``: its token counters
    stand still while 5 requests run and more and more wait (the agent still scrapes it)."""
    lo = LIVE.start_ns + start_s * 10**9
    hit = ((pl.col(c.INSTANCE_ID) == instance)
           & pl.col(c.TS_NS).is_between(lo, lo + seconds * 10**9, closed="left"))
    frozen = [pl.when(hit).then(pl.col(col).filter(
        (pl.col(c.INSTANCE_ID) == instance) & (pl.col(c.TS_NS) < lo)).max())
        .otherwise(pl.col(col)).alias(col)
        for col in (c.PROMPT_TOKENS_TOTAL, c.GENERATION_TOKENS_TOTAL)]
    waiting = (pl.col(c.TS_NS) - lo) / 10**9 + 5
    engine = data.engine_samples.with_columns(
        *frozen, pl.when(hit).then(5.0).otherwise(pl.col(c.NUM_RUNNING)).alias(c.NUM_RUNNING),
        pl.when(hit).then(waiting).otherwise(pl.col(c.NUM_WAITING)).alias(c.NUM_WAITING))
    return dataclasses.replace(data, engine_samples=engine)


def test_a_hang_confirms_the_queue_it_built_as_an_update(tmp_path: Path,
                                                          live: SynthData) -> None:
    instance = live.engine_samples.filter(pl.col(c.HOST_NAME) == "h02")[c.INSTANCE_ID][0]
    data = _hung(live, instance, H, 90)
    root = DataDir(tmp_path / "data")
    write_tables(until(data, H + 20), root)  # 20 s in: a queue, too early for a hang
    with serve() as rec:
        cfg = config_file(tmp_path, hooks(rec))
        analyze(root, cfg)
        (first,) = bodies(rec, "/native")
        assert first["status"] == STATUS_PROVISIONAL and first["causes"] == []
        write_tables(until(data, H + 60), root)  # the hang detector's 30 s are up
        analyze(root, cfg)
        native = bodies(rec, "/native")
        assert len(native) == 2, native  # the hang is an update, not a second page
        assert native[1]["type"] == UPDATE_TYPE and native[1]["status"] == STATUS_CONFIRMED
        assert native[1]["incident_id"] == first["incident"][c.INCIDENT_ID]
        assert (native[1]["causes"][0][c.CAUSE], native[1]["causes"][0][c.SUBJECT]) == (
            "engine_hang", f"instance_id={instance}")


def _decoding(data: SynthData, host: str, start_s: int, seconds: int) -> SynthData:
    """``data`` with engines that decode as engines do: 20 running requests, their tokens
    counted at 1 / TPOT each per second (20 ms), and from ``start_s`` for ``seconds`` every
    step of ``host``'s engines 50% slower (30 ms), with no request waiting."""
    lo = LIVE.start_ns + start_s * 10**9
    slow = ((pl.col(c.HOST_NAME) == host)
            & pl.col(c.TS_NS).is_between(lo, lo + seconds * 10**9, closed="left"))
    tpot = pl.when(slow).then(0.03).otherwise(0.02)
    engine = (data.engine_samples.sort(c.INSTANCE_ID, c.TS_NS)
              .with_columns(pl.lit(20.0).alias(c.NUM_RUNNING), pl.lit(0.0).alias(c.NUM_WAITING),
                            (20.0 / tpot).alias("_tok_s"))
              .with_columns(pl.col("_tok_s").cum_sum().over(c.INSTANCE_ID)
                            .alias(c.GENERATION_TOKENS_TOTAL))
              .drop("_tok_s"))
    return dataclasses.replace(data, engine_samples=engine)


def test_a_slower_decode_without_a_queue_is_posted_as_engine_overhead(
        tmp_path: Path, live: SynthData) -> None:
    root = DataDir(tmp_path / "data")
    write_tables(until(_decoding(live, "h02", H, 120), H + 30), root)
    with serve() as rec:
        analyze(root, config_file(tmp_path, f'webhooks = ["{rec.url()}"]\n'
                                            '[analytics.provisional]\ndecode_ratio = 0'))
        assert rec.posts() == []  # the rule off: no queue, nothing to say
        analyze(root, config_file(tmp_path, f'webhooks = ["{rec.url()}"]'))
        (posted,) = [r.json() for r in rec.posts()]
        assert posted["status"] == STATUS_PROVISIONAL
        assert posted["incident"][c.HOST_NAME] == "h02"
        top = posted["causes"][0]
        assert (top[c.CAUSE], top[c.SUBJECT]) == ("engine_overhead", "host_name=h02")
        assert top[c.EVIDENCE]["tpot_gauge_s"] == pytest.approx(0.03, rel=0.05)
        assert top[c.EVIDENCE]["tpot_gauge_before_s"] == pytest.approx(0.02, rel=0.05)
