"""Live detection delay: how long after a failure or a latency incident begins is it posted?

Issue 30 item 6: with ``fleetlens pipeline --follow`` a failure is posted within 60 s of its
onset (p95) and a latency incident within 2 windows of its first anomalous window. This bench
runs the real processes in real time, all on loopback:

- a collector (``fleetlens collector``, 127.0.0.1, free ports, its own data directory, its
  default settings: raw Parquet segments every ``flush_interval_s`` = 5 s);
- a webhook receiver on 127.0.0.1 (in this process) that records each post's arrival time
  and its native JSON body (incident id, start, detected_ns, top causes and subjects);
- ``fleetlens pipeline --follow`` as a subprocess, with a ``fleetlens.toml`` written here: its
  webhook is the receiver; ``[pipeline] window_s`` and ``[analytics] window_s`` = 10 s and
  ``--interval`` 2 s. Why 10 s windows: a latency breach needs ``consecutive`` (3) windows
  and 2 windows of slack is the target, so a live check wants short windows (at the default
  60 s a latency incident is posted 3-4 minutes after it starts by construction), and a band
  needs ``rolling_min_windows`` (20) windows of history, 200 s at 10 s instead of 20 minutes.
  Why a 2 s interval: the follow loop sleeps ``--interval`` after each run (pipeline and
  analytics), so its period is their run times plus the interval; the default 10 s
  (``pipeline.follow_interval_s``, left unchanged) adds up to 10 s to every delay. The
  failure detectors keep their defaults (``down_after_s`` 10, ``hang_after_s`` 30,
  ``silent_after_s`` 40: a host is lost only after 40 s of silence); ``--set`` overrides
  any ``[analytics]`` key to see what a setting buys;
- the simulator at ``--speed 1`` (real time, virtual clock = wall clock at its start; agent
  metrics every second, as the real agent scrapes) in a child process, on a scenario written
  here: service ``fail`` (3 hosts x 2 H100, Llama-3.1-8B, every request through a gateway)
  takes the failures one after another in 90 s slots: ``engine_down``, ``engine_hang``,
  ``request_errors`` (30% aborted on a host), ``host_down``, ``telemetry_gap``; services
  ``lat-b``, ``lat-c``, ``lat-d`` (2 hosts x 2 L4 each, Llama-3.1-8B, near half their
  capacity) each take one latency incident per round (``traffic_surge`` x3,
  ``kv_cache_pressure`` 0.9, ``engine_overhead`` +30 ms, rotating), 60 s long and staggered,
  so that no two incidents share a service and two on one service are more than
  ``merge_gap_s`` (180 s) apart. Rounds are 450 s after a 240 s warm-up (the rolling
  baselines' 20 windows and some spread); ``--repeat 2`` (default) gives 10 failures and 6
  latency incidents in about 21 minutes.

Provisional incidents (``[analytics.provisional]``, on by default: a queue on the engines'
gauges, posted before its slow requests end) are posted and scored like any incident; their
confirmation is an update post, which counts as the confirmed incident's post. The figures
are printed twice at the end: with every post, and with the span-based and failure posts
only (the same run's: batch detection is unchanged, so that is when they would have been
posted without provisional incidents); ``--set provisional.enabled=false`` runs without them.

Each injected incident (the simulator's ground truth) is matched to the first post whose top
cause is the injected cause, whose scope is the injected one (subject, or host / service),
and whose incident starts inside the injected window (less 30 s: a hang starts at the last
progress). Delays are measured on the wall clock from the moment the simulator played the
onset (the child reports its progress every tick, so its start-up and any lag are taken
out). Printed per kind and overall: count, median, p95, max, misses; for latency incidents
also the delay after their first anomalous window (the posted incident's start), in seconds
and windows; and where the time goes: the detector's own condition (onset to the incident's
``detected_ns``) against the rest (the slow requests themselves: a request's span, which
carries its TTFT, is sent when the request ends, so a window's latency is known only once
its slow requests finish; then the collector's flush, the follow loop's wait, its pipeline
and analytics runs, the post), with the follow loop's measured run times. The machine's
load average is printed beside the figures: this runs in real time and is sensitive to
other work on the machine.

    .venv/bin/python bench/detect_delay.py                  # about 21 minutes
    .venv/bin/python bench/detect_delay.py --minutes 7      # a short check (one round cut)
    .venv/bin/python bench/detect_delay.py --set failures.silent_after_s=30 --keep /tmp/dd

Everything it starts (collector, follow loop, simulator and its exporter) is stopped by PID
on exit, on Ctrl-C and on SIGTERM; it is bounded in time (``--minutes`` + 5 minutes at most).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.detect_delay_scenario import scenario_doc  # noqa: E402
from bench.detect_delay_score import (  # noqa: E402
    FAILURE_KINDS,
    INCIDENT,
    LATENCY_KINDS,
    UPDATE,
    Clock,
    compare,
    match,
    report,
)

NS = 1_000_000_000
WINDOW_S = 10
INTERVAL_S = 2.0

# ---------------------------------------------------------------------------- scenario

def simulate_child(spec_path: str) -> None:
    """Hidden mode (``--simulate-child SPEC``): run the scenario at speed 1 and print one JSON
    line per tick with the wall time, so the parent maps virtual onsets to wall time."""
    from fleetlens.collector.testing import exit_on_sigterm
    from fleetlens.simulator import parse_scenario
    from fleetlens.simulator import run as simulate

    exit_on_sigterm()
    spec = json.loads(Path(spec_path).read_text())
    start_ns = time.time_ns()
    print(json.dumps({"start_ns": start_ns}), flush=True)

    def progress(p: Any) -> None:
        print(json.dumps({"sim_s": p.sim_s, "wall_ns": time.time_ns()}), flush=True)

    result = simulate(parse_scenario(spec["scenario"]), spec["endpoint"], speed=1.0,
                      start_ns=start_ns, ground_truth_path=spec["ground_truth"],
                      on_progress=progress)
    e = result.exported
    print(json.dumps({"done": True, "requests": result.requests, "failed": result.failed,
                      "spans_sent": e.spans_sent, "points_sent": e.points_sent,
                      "spans_failed": e.spans_failed, "points_failed": e.points_failed}),
          flush=True)


# ---------------------------------------------------------------------------- processes

class Receiver:
    """A webhook receiver on 127.0.0.1: records (arrival ns, body) of every POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[int, Any]] = []
        lock = threading.Lock()
        posts = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                arrived = time.time_ns()
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"unparsed": raw[:200].decode(errors="replace")}
                with lock:
                    posts.append((arrived, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Child:
    """A subprocess in its own session, its output lines read by a thread."""

    name: str
    process: subprocess.Popen[str]
    log: Path
    lines: list[tuple[int, str, str]] = field(default_factory=list)  # (wall ns, stream, line)
    threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, name: str, command: list[str], log: Path, env: dict[str, str]) -> Child:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env, start_new_session=True, cwd=REPO)
        child = cls(name, process, log)
        out = log.open("a")
        for stream, pipe in (("out", process.stdout), ("err", process.stderr)):
            thread = threading.Thread(target=child._read, args=(stream, pipe, out), daemon=True)
            thread.start()
            child.threads.append(thread)
        return child

    def _read(self, stream: str, pipe: Any, out: Any) -> None:
        for line in pipe:
            now = time.time_ns()
            self.lines.append((now, stream, line.rstrip("\n")))
            out.write(f"{now / NS:.3f} {stream} {line}")
            out.flush()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM by PID (the follow loop finishes its run), SIGKILL of its group after
        ``timeout`` (its session is its own: only what it started)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # stragglers (the exporter child)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def parse_set(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--set failures.silent_after_s=30`` -> {"analytics.failures": {...}}."""
    tables: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        table, _, name = key.strip().rpartition(".")
        tables.setdefault("analytics" + (f".{table}" if table else ""), {})[name] = value
    return tables


def write_config(path: Path, hook_url: str, interval_s: float,
                 overrides: dict[str, dict[str, Any]]) -> None:
    tables: dict[str, dict[str, Any]] = {
        "pipeline": {"window_s": WINDOW_S, "follow_interval_s": interval_s},
        "analytics": {"window_s": WINDOW_S, "webhooks": [hook_url]},
    }
    for table, values in overrides.items():
        tables.setdefault(table, {}).update(values)
    text = "\n".join(f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items())
                     for name, body in tables.items())
    path.write_text(text)


# ---------------------------------------------------------------------------- scoring

def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        model = next((line.split(":", 1)[1].strip() for line in info
                      if line.startswith("model name")), model)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, load average {load}"


# ---------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Runs in real time: about 240 + 450 x REPEAT + 100 s (21 minutes by default).")
    parser.add_argument("--repeat", type=int, default=2,
                        help="rounds of 5 failures and 3 latency incidents (450 s each)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="bound the simulated (= wall) time; incidents that do not fit "
                             "are left out")
    parser.add_argument("--seed", type=int, default=7, help="simulator seed")
    parser.add_argument("--interval", type=float, default=INTERVAL_S,
                        help="the follow loop's --interval (s) [default: %(default)s]")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="an [analytics] setting, e.g. failures.silent_after_s=30")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the data directory, logs and posts here")
    parser.add_argument("--simulate-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate_child:
        simulate_child(args.simulate_child)
        return
    from fleetlens.collector.testing import exit_on_sigterm, running_collector

    exit_on_sigterm()  # SIGTERM unwinds through the cleanups below
    limit_s = int(args.minutes * 60) if args.minutes else None
    overrides = parse_set(args.overrides)
    doc = scenario_doc(args.repeat, limit_s, args.seed)
    if not doc["incident"]:
        raise SystemExit("no incident fits: give more --minutes")
    workdir = Path(tempfile.mkdtemp(prefix="detect-delay-")) if args.keep is None else args.keep
    workdir.mkdir(parents=True, exist_ok=True)
    sim_s = doc["fleet"]["duration_s"]
    deadline = time.monotonic() + sim_s + 300  # the whole run, bounded
    print(f"detect_delay: {len(doc['incident'])} incidents over {sim_s / 60:.1f} simulated "
          f"(= wall) minutes, windows {WINDOW_S} s, follow interval {args.interval:g} s; "
          f"work dir {workdir}", flush=True)
    print(f"machine at the start: {machine()}", flush=True)
    receiver = Receiver()
    children: list[Child] = []
    ok = False
    try:
        # no self-metrics listener: 127.0.0.1:8888 may be another collector's
        with running_collector(workdir / "data",
                               config={"self_metrics_address": ""}) as collector:
            config = workdir / "fleetlens.toml"
            write_config(config, receiver.url, args.interval, overrides)
            follow = Child.start("follow", [
                sys.executable, "-m", "fleetlens", "pipeline", "--follow", "--data-dir",
                str(workdir / "data"), "--config", str(config), "--interval",
                str(args.interval), "--format", "json", "--no-progress"],
                workdir / "follow.log", clean_env())
            children.append(follow)
            spec = workdir / "simulate.json"
            truth_path = workdir / "truth.json"
            spec.write_text(json.dumps({"scenario": doc, "endpoint": collector.grpc_address,
                                        "ground_truth": str(truth_path)}))
            sim = Child.start("simulator", [sys.executable, str(Path(__file__).resolve()),
                                            "--simulate-child", str(spec)],
                              workdir / "simulator.log", clean_env())
            children.append(sim)
            last_note = time.monotonic()
            while sim.process.poll() is None and time.monotonic() < deadline:
                time.sleep(1.0)
                if follow.process.poll() is not None:
                    raise SystemExit(f"the follow loop exited ({follow.process.returncode}); "
                                     f"see {follow.log}")
                if time.monotonic() - last_note >= 60:
                    last_note = time.monotonic()
                    ticks = [line for _, s, line in sim.lines if s == "out" and "sim_s" in line]
                    done = json.loads(ticks[-1])["sim_s"] if ticks else 0
                    print(f"  {done:5.0f}/{sim_s} s simulated, {len(receiver.posts)} posts, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
            if sim.process.poll() is None:
                raise SystemExit("the simulator did not finish in time")
            if sim.process.returncode != 0:
                raise SystemExit(f"the simulator failed ({sim.process.returncode}); "
                                 f"see {sim.log}")
            # The last incident ended TAIL_S before the simulation did; give the follow loop
            # two more periods for data still in the collector's buffers.
            time.sleep(min(30.0, max(deadline - time.monotonic(), 0)))
            follow.stop()
            sim_lines = [json.loads(line) for _, s, line in sim.lines if s == "out"]
            start_ns = sim_lines[0]["start_ns"]
            clock = Clock(start_ns, [(x["sim_s"], x["wall_ns"]) for x in sim_lines
                                     if "sim_s" in x])
            truth = json.loads(truth_path.read_text())["incidents"]
            measured = [g for g in truth if g["cause"] in (*FAILURE_KINDS, *LATENCY_KINDS)]
            matches = match(measured, receiver.posts, clock)
            if args.keep is not None:
                (workdir / "posts.json").write_text(json.dumps(
                    [{"arrived_ns": t, "body": b} for t, b in receiver.posts], indent=1))
            ok = report(matches, clock, follow, receiver.posts, WINDOW_S, args.interval, machine(),
                        overrides)
            compare(match(measured, receiver.posts, clock, (INCIDENT, UPDATE)), matches, clock,
                    WINDOW_S, receiver.posts)
    finally:
        for child in reversed(children):
            child.stop()
        receiver.close()
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\nresult: targets met" if ok else "\nresult: targets NOT met (see above)")


if __name__ == "__main__":
    main()
