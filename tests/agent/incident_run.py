"""Helpers for inducing real incidents on a real vLLM server and diagnosing them with the real
command line (``tests/agent/test_vllm_incidents.py``).

- :func:`phase_plan` turns phases of open-loop Poisson load into one loadgen plan and says
  where each phase lies on the wall clock once sent (:class:`Timeline`).
- :func:`running_agent` runs ``fleetlens agent`` scraping one vLLM (no GPU: these machines
  have none, and a simulated GPU's made-up load curve would be evidence the rules could
  weigh).
- :func:`diagnose` runs ``fleetlens pipeline`` and ``fleetlens analyze`` on the data dir and
  returns the published incidents and causes with the tables the CLI prints.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from tests.agent import loadgen
from tests.agent.loadgen import Request
from tests.agent.vllm_env import stop_tree
from tests.conftest import REPO

NS = 1_000_000_000


@dataclass(frozen=True)
class Phase:
    """``seconds`` of Poisson arrivals at ``rate`` requests per second."""

    name: str
    rate: float
    seconds: float


@dataclass
class Timeline:
    """Where each phase of the sent load lies, in wall-clock ns (the spans' clock)."""

    offsets: dict[str, tuple[float, float]]  # phase -> (start, end) seconds into the plan
    sent_ns: int = 0  # wall clock when the plan started
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)

    def send(self, port: int, plan: list[Request]) -> None:
        """Send ``plan`` open-loop and record the wall-clock bounds of its phases."""
        self.sent_ns = time.time_ns()
        loadgen.run(port, plan, timeout_s=600.0)  # requests may queue behind a surge
        for name, (lo, hi) in self.offsets.items():
            self.spans[name] = (self.sent_ns + int(lo * NS), self.sent_ns + int(hi * NS))


def phase_plan(rng: random.Random, phases: list[Phase],
               make: Callable[[float], Request]) -> tuple[list[Request], Timeline]:
    """One plan of all ``phases`` back to back; ``make(at_s)`` builds each request."""
    plan: list[Request] = []
    offsets = {}
    start = 0.0
    for phase in phases:
        end = start + phase.seconds
        plan.extend(make(at) for at in loadgen.poisson(rng, phase.rate, start, end))
        offsets[phase.name] = (start, end)
        start = end
    return plan, Timeline(offsets)


def measure_capacity(port: int, make: Callable[[float], Request], batch: int,
                     batches: int = 3) -> tuple[float, list[Request]]:
    """Requests per second the server at ``port`` completes when saturated: ``batches``
    times ``batch`` (its ``--max-num-seqs``) requests of ``make`` at once; the rate is
    taken after the first ``batch`` completed, so the server's warm-up is left out.
    Returns the rate and the requests sent (their spans land with the rest)."""
    plan = [make(0.0) for _ in range(batch * batches)]
    loadgen.run(port, plan, timeout_s=600.0)
    if any(r.status != 200 for r in plan):
        raise AssertionError(f"calibration failed: {[r.response for r in plan if r.status != 200]}")
    done = sorted(r.sent_at + r.latency_s for r in plan)
    return (len(done) - batch) / max(done[-1] - done[batch - 1], 1e-3), plan


def clean_env() -> dict[str, str]:
    """This environment without FLEETLENS_* settings (they would override the test's)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}


@contextlib.contextmanager
def running_agent(tmp: Path, collector: str, vllm_url: str, instance: str, host: str,
                  scrape_interval_s: float = 1.0) -> Iterator[subprocess.Popen]:
    """``fleetlens agent`` scraping ``vllm_url`` as ``instance``; stopped by PID on exit."""
    config = tmp / "agent.toml"
    config.write_text(f"""
[agent]
collector = "{collector}"
host_name = "{host}"
scrape_interval_s = {scrape_interval_s}
# a collector on a loaded 2-core test machine answered an Export in more than the default
# 10 s (its WAL's fsync behind the suite's writes): the agent kept the collections, but those
# still queued at its stop made it exit non-zero and fail every real-vLLM case
export_timeout_s = 30.0
[[agent.vllm]]
url = "{vllm_url}"
instance_id = "{instance}"
""")
    log_path = tmp / "agent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fleetlens", "agent", "--config",
                                 str(config)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env=clean_env())
    try:
        yield proc
    finally:
        wait_while_undelivered(log_path)
        stop_tree(proc)
    assert proc.returncode == 0, log_path.read_text()


#: How long the agent is left to deliver what it kept before it is stopped. The CI machine's
#: hypervisor once stalled the vLLM part's core for 1.5-3 minutes (the kernel logged
#: "workqueue lockup ... cpus=0 stuck for 93s"): the collector answered nothing, the agent
#: kept its collections as designed, and was stopped right then, so it exited non-zero with
#: 117 collections undelivered and every real-vLLM case failed at setup.
AGENT_DRAIN_S = 240.0


def wait_while_undelivered(log_path: Path, limit_s: float = AGENT_DRAIN_S) -> None:
    """Until the agent's log shows its exports going through again (its last "export to the
    collector failed" followed by "collector reachable again"), at most ``limit_s``: an
    operator does not stop an agent in the middle of a collector outage either."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if text.rfind("export to the collector failed") <= text.rfind("reachable again"):
            return
        time.sleep(2.0)


def wait_for_spans(data: DataDir, count: int, settle_s: float = 20.0,
                   timeout_s: float = 180.0) -> int:
    """Until ``count`` vLLM request spans are in raw Parquet, or their number has not grown
    for ``settle_s``; returns how many landed. Fewer can land: under heavy load vLLM's own
    OTLP exporter drops a batch whose Export missed its 10 s deadline (it logs "Failed to
    export traces ... DEADLINE_EXCEEDED")."""
    deadline = time.monotonic() + timeout_s
    landed, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        spans = scan(data, t.SPANS).filter(pl.col(c.NAME) == a.VLLM_REQUEST_SPAN)
        now = spans.select(pl.len()).collect().item()
        if now >= count:
            return now
        if now != landed:
            landed, since = now, time.monotonic()
        elif time.monotonic() - since > settle_s:
            return now
        time.sleep(1.0)
    return landed


@dataclass
class Diagnosis:
    """What ``fleetlens analyze`` published, and what its commands printed."""

    incidents: pl.DataFrame
    causes: pl.DataFrame
    printed: str

    def overlapping(self, lo_ns: int, hi_ns: int) -> pl.DataFrame:
        """Incidents overlapping [lo_ns, hi_ns], earliest first, with their top cause."""
        top = self.causes.filter(pl.col(c.RANK) == 1).select(c.INCIDENT_ID, c.CAUSE,
                                                             c.SUBJECT, c.SUMMARY)
        return (self.incidents.filter((pl.col(c.START_NS) <= hi_ns)
                                      & (pl.col(c.END_NS) >= lo_ns))
                .join(top, on=c.INCIDENT_ID, how="left").sort(c.START_NS))

    def ranking(self, incident_id: str) -> list[tuple[str, float]]:
        """(cause, score) of one incident, best first."""
        rows = self.causes.filter(pl.col(c.INCIDENT_ID) == incident_id).sort(c.RANK)
        return [(r[c.CAUSE], round(r[c.SCORE], 3)) for r in rows.iter_rows(named=True)]


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "fleetlens", *args], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"fleetlens {' '.join(args)}:\n{done.stderr[-4000:]}"
    return done.stdout


#: ``merge_gap_s`` in windows, as the defaults have it (180 s of 60 s windows).
MERGE_GAP_WINDOWS = 3


def diagnose(data: DataDir, tmp: Path, window_s: int, analytics: str = "") -> Diagnosis:
    """``fleetlens pipeline --full`` and ``fleetlens analyze`` with ``window_s`` windows and
    ``merge_gap_s`` scaled to them (the other settings are the defaults), then the incidents
    table and each incident's causes as ``fleetlens incidents`` / ``explain`` print them.

    Time is compressed (10 s windows, not a minute): the baselines count windows, so they
    scale by themselves, but the merge gap is in seconds; left at 180 s it would be 18
    windows, six times the production default, and glue incidents minutes apart (a warm-up
    blip 80 s into the run swallowed the surge 2 minutes later, on one starved core).
    ``analytics`` is more TOML lines for the ``[analytics]`` table."""
    config = tmp / "fleetlens.toml"
    config.write_text(f"[pipeline]\nwindow_s = {window_s}\n[analytics]\nwindow_s = {window_s}\n"
                      f"merge_gap_s = {MERGE_GAP_WINDOWS * window_s}\n{analytics}")
    where = ["--data-dir", str(data.root), "--config", str(config)]
    _cli("pipeline", *where, "--full", "--no-progress")
    _cli("analyze", *where)
    from fleetlens.analytics.runner import read_table

    incidents = read_table(data, t.INCIDENTS).sort(c.START_NS)
    printed = [_cli("incidents", *where, "--format", "table")]
    for ident in incidents[c.INCIDENT_ID]:
        printed.append(_cli("explain", ident, "--data-dir", str(data.root)))
    return Diagnosis(incidents, read_table(data, t.CAUSES), "\n".join(printed))
