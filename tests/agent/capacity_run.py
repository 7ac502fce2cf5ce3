"""Helpers for the real-vLLM capacity validation (``tests/agent/test_vllm_capacity.py``,
issue 31): the active sweep, its knee from vLLM's own request timings, and a data dir cut
to one period (the twin's calibration period).

- :func:`sweep`: closed-loop concurrency 1, 2, 4, ... (each of ``c`` clients sends its next
  request when its last one is answered) until throughput stops rising, at least to twice
  the engine's seats (past them the batch cannot grow: the requests queue);
- :func:`step_latencies` / :func:`sweep_knee`: each step's TTFT and TPOT percentiles from
  vLLM's own spans in raw Parquet (not from fleetlens' pipeline), and the knee by the same
  SLO the passive estimator judges (``[analytics.capacity]`` defaults);
- :func:`slow_phases`: the load's phases in which the host ran slow, from vLLM's own spans;
- :func:`cut` / :func:`cut_spans`: the raw telemetry of one or some ``[lo, hi)`` spans
  copied to a new data dir, as an operator's data dir holding only those periods would be.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from tests.agent import loadgen
from tests.agent.incident_run import clean_env
from tests.agent.loadgen import Request
from tests.conftest import REPO

NS = 1_000_000_000
#: a doubling of the concurrency that raises the throughput by less than this share is
#: "throughput stopped rising" (the sweep's stopping rule)
MIN_GAIN = 0.10
#: a step within the seats whose median latency is this many times the last step's is
#: measured again (:func:`sweep`)
SPELL = 1.4


@dataclass
class Step:
    """One concurrency level of the sweep, with vLLM's own latencies once they landed."""

    concurrency: int
    batch: int  # the running batch it holds: min(concurrency, seats)
    start_ns: int
    end_ns: int
    requests: list[Request]
    wall_s: float
    figures: dict = field(default_factory=dict)
    discarded: int = 0  # requests of an attempt measured again (their spans land too)

    @property
    def rps(self) -> float:
        """Completed requests per second over the step."""
        return sum(r.status == 200 for r in self.requests) / self.wall_s


async def _closed_loop(port: int, clients: int, seconds: float,
                       make: Callable[[float], Request]) -> tuple[list[Request], float]:
    start = time.monotonic()
    done: list[Request] = []

    async def client() -> None:
        while time.monotonic() - start < seconds:
            req = make(time.monotonic() - start)
            req.sent_at = time.monotonic() - start
            await loadgen._post(port, req, 120.0)  # noqa: SLF001
            req.latency_s = time.monotonic() - start - req.sent_at
            done.append(req)

    await asyncio.gather(*(client() for _ in range(clients)))
    return done, time.monotonic() - start


def _median_latency(step: Step) -> float:
    return float(np.median([r.latency_s for r in step.requests]))


def sweep(port: int, make: Callable[[float], Request], seats: int, step_s: float,
          max_concurrency: int) -> list[Step]:
    """Concurrency 1, 2, 4, ... for ``step_s`` each (the last requests answered after it
    count in it) until a doubling gains less than :data:`MIN_GAIN` past ``2 x seats``, or
    ``max_concurrency``. A step within the seats whose median latency came out
    :data:`SPELL` x the last step's is measured once more, the second kept: on a shared
    host a few seconds of other work slowed every step of one (TPOT 4.0 ms against 1.9-2.3
    before and after), and a real rise of the step time repeats."""
    steps: list[Step] = []
    clients = 1
    while True:
        discarded = 0
        for attempt in range(2):
            start_ns = time.time_ns()
            done, wall = asyncio.run(_closed_loop(port, clients, step_s, make))
            step = Step(clients, min(clients, seats), start_ns, time.time_ns(), done, wall,
                        discarded=discarded)
            if any(r.status != 200 for r in done):
                raise AssertionError(f"sweep at {clients}: {[r.response for r in done][:3]}")
            if (attempt or not steps or clients > seats
                    or _median_latency(step) < SPELL * _median_latency(steps[-1])):
                break
            discarded = len(done)
        steps.append(step)
        gain = steps[-1].rps / steps[-2].rps - 1 if len(steps) > 1 else 1.0
        if clients >= max_concurrency or (clients >= 2 * seats and gain < MIN_GAIN):
            return steps
        clients *= 2


def _spans(data: DataDir, lo: int, hi: int) -> pl.DataFrame:
    """vLLM's request spans that arrived in [lo, hi): their TTFT and TPOT as vLLM timed
    them (TPOT: decode time over the output tokens after the first)."""
    return (scan(data, t.SPANS)
            .filter((pl.col(c.NAME) == a.VLLM_REQUEST_SPAN) & pl.col(c.START_NS).is_between(
                lo, hi, closed="left"))
            .select(pl.col(c.GEN_AI_TTFT_S).alias(c.TTFT_S),
                    (pl.col(c.GEN_AI_DECODE_S) / (pl.col(c.GEN_AI_COMPLETION_TOKENS) - 1))
                    .alias(c.TPOT_S))
            .collect())


def step_latencies(data: DataDir, steps: list[Step]) -> None:
    """Each step's request count, TTFT and TPOT p50/p99 (``figures``), from its spans."""
    for step in steps:
        spans = _spans(data, step.start_ns, step.end_ns)
        step.figures = {"concurrency": step.concurrency, "batch": step.batch,
                        "rps": round(step.rps, 2), "spans": spans.height}
        for col in (c.TTFT_S, c.TPOT_S):
            values = spans[col].drop_nulls().to_numpy()
            for q in (50, 99):
                step.figures[f"{col[:-2]}_p{q}_ms"] = (
                    round(float(np.percentile(values, q)) * 1e3, 2) if values.size else None)


def sweep_knee(steps: list[Step], tpot_ratio: float, ttft_p99_s: float) -> Step:
    """The last step, in order, at which TPOT p99 is at most ``tpot_ratio`` x the first
    step's (concurrency 1: batch 1) and TTFT p99 at most ``ttft_p99_s``, before two steps
    in a row (or the last step) break it. A lone step over the SLO between steps within it
    is the host's, not the engine's: the step time does not fall as the batch grows, and a
    3 s step's p99 is about its slowest request (12-16 at concurrency 2: one run's TPOT
    p99 4.01 ms against a limit of 3.73, 2.31 and 2.44 at concurrency 4 and 8, put the
    knee at 1 where the seats, 8, are)."""
    base = steps[0].figures["tpot_p99_ms"]

    def within(step: Step) -> bool:
        return (step.figures["tpot_p99_ms"] <= tpot_ratio * base
                and step.figures["ttft_p99_ms"] <= ttft_p99_s * 1e3)

    knee = steps[0]
    for i, step in enumerate(steps[1:], start=1):
        if within(step):
            knee = step
        elif i + 1 == len(steps) or not within(steps[i + 1]):
            break
    return knee


def slow_phases(data: DataDir, phases: dict[str, tuple[int, int]], ratio: float
                ) -> list[str]:
    """The phases (``name + number`` -> ``[lo, hi)`` ns) whose TPOT p50, as vLLM timed its
    requests, is more than ``ratio`` x the median of the phases of their kind (the same
    name less its number): a spell in which the host itself ran slow."""
    p50: dict[str, float] = {}
    for name, (lo, hi) in phases.items():
        tpot = _spans(data, lo, hi)[c.TPOT_S].drop_nulls()
        if tpot.len():
            p50[name] = float(tpot.median())  # type: ignore[arg-type]
    kinds: dict[str, list[float]] = {}
    for name, value in p50.items():
        kinds.setdefault(name.rstrip("0123456789"), []).append(value)
    return sorted(name for name, value in p50.items()
                  if value > ratio * float(np.median(kinds[name.rstrip("0123456789")])))


def cut(src: DataDir, dst: Path, lo: int, hi: int) -> DataDir:
    """A new data dir with the raw telemetry of ``[lo, hi)`` only: metric points stamped in
    it, spans that started and ended in it (same file layout)."""
    return cut_spans(src, dst, [(lo, hi)])


def cut_spans(src: DataDir, dst: Path, spans: list[tuple[int, int]]) -> DataDir:
    """:func:`cut` to several ``[lo, hi)`` ``spans`` at once: what lies in any of them."""
    for path in sorted((src.root / "raw").rglob("*.parquet")):
        frame = pl.read_parquet(path)
        if "end_ns" in frame.columns:
            keep = frame.filter(pl.any_horizontal([
                (pl.col("start_ns") >= lo) & (pl.col("end_ns") < hi) for lo, hi in spans]))
        else:
            keep = frame.filter(pl.any_horizontal([
                pl.col("ts_ns").is_between(lo, hi, closed="left") for lo, hi in spans]))
        if keep.height:
            out = dst / path.relative_to(src.root)
            out.parent.mkdir(parents=True, exist_ok=True)
            keep.write_parquet(out)
    return DataDir(dst)


def cli(*args: str) -> str:
    """``fleetlens ARGS`` in a fresh process; its stdout (fails with its stderr)."""
    done = subprocess.run([sys.executable, "-m", "fleetlens", *args], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"fleetlens {' '.join(args)}:\n{done.stderr[-4000:]}"
    return done.stdout


def analysed(data: DataDir, config: Path) -> None:
    """``fleetlens pipeline --full`` then ``fleetlens analyze`` on ``data``."""
    where = ["--data-dir", str(data.root), "--config", str(config)]
    cli("pipeline", *where, "--full", "--no-progress")
    cli("analyze", *where)


def capacity_rows(data: DataDir, config: Path, *extra: str) -> list[dict]:
    """``fleetlens capacity [extra] --format json``'s rows."""
    return json.loads(cli("capacity", "--data-dir", str(data.root), "--config", str(config),
                          "--format", "json", *extra))
