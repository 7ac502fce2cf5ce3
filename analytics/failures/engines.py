"""Engines that died, hang or restarted, from `engine_samples` (the agent's scrapes).

* down: every scrape failed (``up`` = 0) for ``down_after_s``; it starts at the first
  failed scrape and ends at the next one that worked. When most of those scrapes timed out
  (``unresponsive``: the port took the connection and the process never answered, as a
  stopped or stuck process does) it is a hang, not a crash (a refused connection). Failed
  scrapes before the engine's first good one are an engine starting (a vLLM answers 30-90 s
  after its process starts, and an agent may start first), not a failure, until
  ``never_up_after_s``: then it never came up (:func:`never_up`).
* hang: ``/metrics`` answers, requests are running, and neither a prompt nor a generated
  token was computed for ``hang_after_s``; it starts at the last progress.
* restart: the process start time changed; it starts at the new process' start.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.failures.findings import LEVEL_HOST, Finding, runs
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000
#: A process start time that moved by less is the same process (float rounding).
_SAME_START_S = 1.0
#: A restart incident covers the minute after the new process' first scrape (cold caches).
_COLD_NS = 60 * NS
_COLUMNS = (c.UP, c.PROCESS_START_TIME_S, c.NUM_RUNNING, c.GENERATION_TOKENS_TOTAL,
            c.PROMPT_TOKENS_TOTAL, c.UNRESPONSIVE)


def engine_frame(engine: pl.LazyFrame) -> pl.DataFrame:
    """The columns the detectors read, one row per (instance, ts), sorted; the liveness
    columns are null where an older agent did not send them."""
    names = engine.collect_schema().names()
    keep = [col for col in _COLUMNS if col in names]
    frame = engine.select(c.HOST_NAME, c.INSTANCE_ID, c.MODEL, c.TS_NS, *keep)
    frame = frame.with_columns(pl.lit(None, pl.Float64).alias(col)
                               for col in _COLUMNS if col not in names)
    # one row per scrape: at least-once delivery and hour edges may repeat a sample
    return (frame.unique([c.INSTANCE_ID, c.TS_NS], keep="first")
            .sort(c.INSTANCE_ID, c.TS_NS).collect())


def _label(row: dict, services: dict[str, str]) -> dict:
    inst = row[c.INSTANCE_ID]
    return {"service": services.get(inst, FLEET_WIDE), "model": row[c.MODEL] or "",
            "host": row[c.HOST_NAME], "subject": subject(c.INSTANCE_ID, inst)}


def down(frame: pl.DataFrame, services: dict[str, str], cfg: FailureConfig) -> list[Finding]:
    """Runs of failed scrapes of one engine lasting ``down_after_s`` or more."""
    was_up = (pl.col(c.UP) == 1).fill_null(False).cast(pl.Int32).cum_max().over(c.INSTANCE_ID)
    flagged = frame.with_columns(
        ((pl.col(c.UP) == 0).fill_null(False) & (was_up > 0)).alias("_down"),
        pl.col(c.TS_NS).shift(-1).over(c.INSTANCE_ID).alias("_next"))
    spans = (flagged.with_columns(runs(pl.col("_down"), c.INSTANCE_ID).alias("_run"))
             .filter(pl.col("_down"))
             .group_by(c.INSTANCE_ID, "_run")
             .agg(pl.col(c.HOST_NAME).first(), pl.col(c.MODEL).max(),
                  pl.col(c.TS_NS).min().alias("_start"), pl.col(c.TS_NS).max().alias("_last"),
                  pl.col("_next").last(), pl.len().alias("_scrapes"),
                  pl.col(c.UNRESPONSIVE).fill_null(0).mean().alias("_timeouts"))
             .filter(pl.col("_last") - pl.col("_start") >= int(cfg.down_after_s * NS))
             .sort("_start"))
    out = []
    for row in spans.iter_rows(named=True):
        ongoing = row["_next"] is None
        end = row["_last"] if ongoing else row["_next"]
        label = _label(row, services)
        seconds = (end - row["_start"]) / NS
        hung = row["_timeouts"] > 0.5
        what = (f"hangs: {row['_scrapes']} scrapes in a row over {seconds:.0f} s took the "
                "connection and got no answer" if hung else
                f"down: {row['_scrapes']} scrapes failed in a row over {seconds:.0f} s")
        out.append(Finding(
            Cause.ENGINE_HANG if hung else Cause.ENGINE_DOWN, label["subject"],
            label["service"], label["model"], label["host"], row["_start"], end,
            row["_start"] + int(cfg.down_after_s * NS), c.UP, 0.0, 1.0,
            f"engine {row[c.INSTANCE_ID]} {what}" + (" (still)" if ongoing else ""),
            evidence={"failed_scrapes": row["_scrapes"], "down_s": seconds, "ongoing": ongoing,
                      "timed_out_share": row["_timeouts"], c.INSTANCE_ID: row[c.INSTANCE_ID]}))
    return out


def never_up(frame: pl.DataFrame, services: dict[str, str], cfg: FailureConfig
             ) -> list[Finding]:
    """Engines no scrape ever reached, from the agent's first scrape of them for
    ``never_up_after_s`` or more: not starting any more, never up (:func:`down` leaves
    failed scrapes before the first good one out). It starts at the first scrape."""
    spans = (frame.group_by(c.INSTANCE_ID)
             .agg(pl.col(c.HOST_NAME).first(), pl.col(c.MODEL).max(),
                  pl.col(c.TS_NS).min().alias("_start"), pl.col(c.TS_NS).max().alias("_last"),
                  pl.len().alias("_scrapes"), (pl.col(c.UP) == 1).any().alias("_was_up"),
                  pl.col(c.UP).is_not_null().any().alias("_known"))
             .filter(~pl.col("_was_up") & pl.col("_known")
                     & (pl.col("_last") - pl.col("_start") >= int(cfg.never_up_after_s * NS)))
             .sort("_start", c.INSTANCE_ID))
    out = []
    for row in spans.iter_rows(named=True):
        label = _label(row, services)
        seconds = (row["_last"] - row["_start"]) / NS
        out.append(Finding(
            Cause.ENGINE_DOWN, label["subject"], label["service"], label["model"],
            label["host"], row["_start"], row["_last"],
            row["_start"] + int(cfg.never_up_after_s * NS), c.UP, 0.0, 1.0,
            f"engine {row[c.INSTANCE_ID]} never came up: none of {row['_scrapes']} scrapes "
            f"over {seconds:.0f} s answered, from its first in the data analysed (a wrong "
            "URL, a crash at start, or down since before that data)",
            evidence={"never_up": True, "failed_scrapes": row["_scrapes"], "down_s": seconds,
                      "ongoing": True, c.INSTANCE_ID: row[c.INSTANCE_ID]}))
    return out


def hangs(frame: pl.DataFrame, services: dict[str, str], cfg: FailureConfig) -> list[Finding]:
    """Runs where running requests made no progress for ``hang_after_s`` while up."""
    tokens = pl.col(c.GENERATION_TOKENS_TOTAL).fill_null(0) + pl.col(
        c.PROMPT_TOKENS_TOTAL).fill_null(0)
    progressed = (tokens != tokens.shift(1)).fill_null(True).over(c.INSTANCE_ID)
    frame = frame.with_columns(
        pl.when(progressed | (pl.col(c.NUM_RUNNING).fill_null(0) <= 0)).then(pl.col(c.TS_NS))
        .forward_fill().over(c.INSTANCE_ID).alias("_since"))
    stalled = ((pl.col(c.UP) != 0).fill_null(True) & (pl.col(c.NUM_RUNNING) > 0)
               & (pl.col(c.TS_NS) - pl.col("_since") >= int(cfg.hang_after_s * NS)))
    spans = (frame.with_columns(stalled.fill_null(False).alias("_hung"),
                                pl.col(c.TS_NS).shift(-1).over(c.INSTANCE_ID).alias("_next"))
             .with_columns(runs(pl.col("_hung"), c.INSTANCE_ID).alias("_run"))
             .filter(pl.col("_hung"))
             .group_by(c.INSTANCE_ID, "_run")
             .agg(pl.col(c.HOST_NAME).first(), pl.col(c.MODEL).max(),
                  pl.col("_since").min().alias("_start"), pl.col(c.TS_NS).min().alias("_seen"),
                  pl.col(c.TS_NS).max().alias("_last"), pl.col("_next").last(),
                  pl.col(c.NUM_RUNNING).max().alias("_running"))
             .sort("_start"))
    out = []
    for row in spans.iter_rows(named=True):
        end = row["_next"] if row["_next"] is not None else row["_last"]
        label = _label(row, services)
        seconds = (end - row["_start"]) / NS
        out.append(Finding(
            Cause.ENGINE_HANG, label["subject"], label["service"], label["model"],
            label["host"], row["_start"], end, row["_seen"], c.NUM_RUNNING,
            float(row["_running"]), None,
            f"engine {row[c.INSTANCE_ID]} hangs: {row['_running']:.0f} running requests and "
            f"no new token for {seconds:.0f} s while its /metrics answered",
            evidence={"running": row["_running"], "stalled_s": seconds,
                      c.INSTANCE_ID: row[c.INSTANCE_ID]}))
    return out


def restarts(frame: pl.DataFrame, services: dict[str, str], cfg: FailureConfig
             ) -> list[Finding]:
    """Samples whose process start time differs from the engine's previous one."""
    start = pl.col(c.PROCESS_START_TIME_S)
    previous = start.forward_fill().shift(1).over(c.INSTANCE_ID)
    changed = frame.with_columns(previous.alias("_before")).filter(
        start.is_not_null() & pl.col("_before").is_not_null()
        & ((start - pl.col("_before")).abs() >= _SAME_START_S))
    out = []
    for row in changed.iter_rows(named=True):
        label = _label(row, services)
        began = min(int(row[c.PROCESS_START_TIME_S] * NS), row[c.TS_NS])
        out.append(Finding(
            Cause.ENGINE_RESTART, label["subject"], label["service"], label["model"],
            label["host"], began, row[c.TS_NS] + _COLD_NS, row[c.TS_NS], c.PROCESS_START_TIME_S,
            float(row[c.PROCESS_START_TIME_S]), float(row["_before"]),
            f"engine {row[c.INSTANCE_ID]} restarted: a new process started "
            f"{(row[c.TS_NS] - began) / NS:.0f} s before this scrape (caches start cold)",
            evidence={"previous_start_s": row["_before"],
                      "start_s": row[c.PROCESS_START_TIME_S],
                      c.INSTANCE_ID: row[c.INSTANCE_ID]}))
    return out


def per_host(found: list[Finding], together_ns: int) -> list[Finding]:
    """Engine findings of one cause on two or more engines of a host that began within
    ``together_ns`` of each other become one finding of the host (a host's engines crashing
    or restarting together is one event, the host's); the rest stay as they are."""
    out: list[Finding] = []
    groups: dict[tuple[str, str], list[list[Finding]]] = {}
    for f in sorted(found, key=lambda f: f.start_ns):
        spells = groups.setdefault((f.cause, f.host), [])
        if spells and f.start_ns - spells[-1][0].start_ns <= together_ns:
            spells[-1].append(f)
        else:
            spells.append([f])
    for (_cause, host), spells in groups.items():
        for spell in spells:
            engines = sorted({f.evidence[c.INSTANCE_ID] for f in spell})
            if len(engines) < 2:
                out += spell
                continue
            first = min(spell, key=lambda f: f.start_ns)
            out.append(Finding(
                first.cause, subject(c.HOST_NAME, host), first.service, first.model, host,
                first.start_ns, max(f.end_ns for f in spell),
                min(f.detected_ns for f in spell), first.metric, first.peak, first.expected,
                f"{len(engines)} engines of {host}: " + "; ".join(
                    dict.fromkeys(f.summary for f in spell)), LEVEL_HOST,
                {**first.evidence, c.INSTANCE_ID: None, "instances": engines}))
    return sorted(out, key=lambda f: f.start_ns)
