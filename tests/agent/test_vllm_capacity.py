"""Issue 31 on a real vLLM (the CPU build, the tiny model): the passive knee that
``fleetlens capacity`` estimates from production-like telemetry against an active sweep's,
and the calibrated twin (``fleetlens capacity --what-if``) against a run at a higher rate.

One server with ``--max-num-seqs`` :data:`SEATS` and :data:`SHAPE`'s answers:

1. the active sweep (:func:`tests.agent.capacity_run.sweep`), before the agent runs, so
   its windows are not elasticity points of the passive estimate: closed-loop concurrency
   1, 2, 4, ... until throughput stops rising. Its knee is judged by the passive
   estimator's own default SLO (TPOT p99 at most 1.5x its batch-1 value, TTFT p99 at most
   2 s) from vLLM's own timings of each step, and stated as the batch it ran;
2. the agent scrapes, and open-loop Poisson load varies as a day would, in fractions of the
   sweep's top throughput: :data:`LOW` and :data:`HIGH` alternating every window
   :data:`PAIRS` times (more while the host was busy: :data:`DISTURBED`), then :data:`TAIL`
   (a ramp to the capacity, then over it);
3. ``fleetlens pipeline`` + ``analyze`` + ``capacity`` on the data dir: the passive knee;
4. the twin: the data dir cut to the low-rate phases' calm seconds (what an operator's data
   would hold had they asked then), analysed, and ``--what-if rate=K,max_num_seqs=SEATS``
   (vLLM 0.32 reports no ``max_num_seqs``: the operator states it) with K the high phase's
   rate over the low one's, against the high phases' requests as the pipeline measured
   them, in their calm seconds (:mod:`tests.agent.capacity_host`: what other processes
   took of the server's core) and out of the phases in which the host itself ran slow
   (:data:`SPELL_RATIO`), on either side.

On this engine the knee is the seat limit: the CPU decode step is overhead-bound (TPOT p50
1.6-2.2 ms from batch 1 to 8 on a calm host, up to 4.4 on a busy one), throughput about
doubles with each doubling of the concurrency up to the seats and not past them, and no
TPOT SLO breaks below them.

The twin (analytics/capacity/twin_requests.py) is calibrated on the low phase's requests
themselves: the decode step against the batch each request decoded in, with its arrivals as
instrument (a host's slow spell makes requests overlap more, which a plain fit read as a
slope and extrapolated to a saturated twin), the time outside the engine from the requests
that found it idle (those that found it busy: their own, less half a step), and each step
as slow as the requests it carries ran.

Margins: the issue's own for the knee (within one step of the sweep's grid: a factor 2)
and the twin (TTFT and TPOT p50/p90 within 20%). The sweep's knee is the last step within
the SLO before two steps in a row break it (:func:`capacity_run.sweep_knee`). Mine: the
sweep stops when a doubling gains under 10% (:data:`capacity_run.MIN_GAIN`), and below the
seats each doubling must gain 20% (a flat step time doubles it: 47-121% measured). Every
figure is printed, with the requests each percentile is of. About 3.8 minutes on one
core (server start ~35 s, sweep ~16 s, load ~165 s, analysis ~5 s); ``make test`` runs it
only with ``tests/run_suite.py --capacity`` (its figures per run: docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from fleetlens.analytics.capacity.config import CapacityConfig
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from tests.agent.capacity_host import HostSampler, settle
from tests.agent.capacity_run import (
    NS,
    Step,
    analysed,
    capacity_rows,
    cut_spans,
    slow_phases,
    step_latencies,
    sweep,
    sweep_knee,
)
from tests.agent.incident_load import PROMPT_WORDS, Shape
from tests.agent.incident_run import Phase, phase_plan, running_agent, wait_for_spans
from tests.agent.loadgen import Request, prompt_of
from tests.agent.vllm_env import build_tiny_model, ensure_vllm_venv, free_port, running_vllm
from tests.agent.vllm_scenario import EXPORTER_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOST = "capacity-host"
INSTANCE = f"{HOST}/tiny-0"
#: 5 s windows: the low phase's 45 s give 9, one more than ``min_windows`` (8) with the
#: window edges off the phase's (10 s windows needed a 90 s phase)
WINDOW_S = 5
SEATS = 8
#: 136-token answers (two cache blocks): short requests, many per 10 s window
SHAPE = Shape(blocks=2)
#: seconds per sweep step: a closed loop's throughput is its clients over their latency,
#: which a few requests tell (about 7 at concurrency 1)
STEP_S = 3.0
#: (fraction of the sweep's top throughput, seconds) of the low and the high phases,
#: alternating :data:`PAIRS` times. The low phases are the twin's calibration; the high ones
#: twice their rate, where TTFT p90 is the engine's and the API server's time and not a
#: seat's wait. At 40% of the top (about 4.2 of the 8 seats busy where the shared host ran
#: requests 0.35 s long) 9.3% of the requests waited for a seat (Erlang C: 7.5%): the phase's
#: TTFT p90 fell on the queue's edge (25 ms against 7 ms for its p50) and the twin, whose own
#: Poisson bursts are other draws, put it at 10 ms. At 30% (2.2-3.1 seats) 0.4-1.5% wait,
#: and a host 30% slower still leaves the p90 to the engine (6%). The sweep's top
#: overstates the seats' rate under the load (the agent and collector share the core, a
#: Poisson arrival finds no client waiting to refill a seat).
#: Low and high alternate every window: the shared host's speed moves by up to 2x within a
#: minute, outside this machine (a Firecracker VM: no other process on the server's core, no
#: steal counted, and TPOT went from 2.0 to 3.3-5.1 ms 20 s into a run and stayed there,
#: while the idle prefill held at 38-48 us per token), and over 15 s and 10 s phases the two
#: rates met different hosts (TTFT p50 -14% and -17% after one 45 s low phase; TTFT p90 -59%
#: and -87%, TPOT p90 -27%, with three pairs of 15 s and 10 s). Alternating every 5 s, both
#: rates see the same host at every time scale past a few seconds; a high phase's batch
#: settles within one request's life (0.3-0.5 s: :data:`SETTLE_S`)
LOW, HIGH = (0.15, 5.0), (0.3, 5.0)
#: pairs of (low, high) always sent, and at most this many more while the host was too busy
#: (:data:`DISTURBED`) or slow (:data:`SPELL_RATIO`) for :data:`CALM_LOW_S` and
#: :data:`CALM_HIGH_S` of calm time (one run's host ran four of the first high phases slow:
#: 32 s of them calm). With 8
#: pairs (129-156 calibration requests, 244-292 measured) the twin's TTFT p90 missed in 2
#: of 5 calm runs (-20% and -25%) while the measured one moved 6.4-11.0 ms from run to run:
#: a p90 of 150 requests rests on its 15 slowest
PAIRS, MORE_PAIRS = 12, 3
#: after the pairs, a ramp to the capacity and over it (the passive knee's queue), in
#: fractions of the sweep's top. The passive knee is the largest batch a window met the SLO
#: at below the overload's, so some window must meet it near the seats whatever the host's
#: speed then: with only 85% before the overload, a fast host ran it at batch 3.6 (TTFT p99
#: 0.11 s: 1 run of 13), and a host slower than in the sweep (TPOT p50 3.6 ms against 1.9 at
#: the same batch) broke the SLO in it (TTFT p99 3.3 s at batch 7.3) and in every later
#: window, 100% included, while the 30% windows met it at 3.9: both knees came out at the
#: batch of the last window that met it, 3.6 and 3.9, against the sweep's 8. From 50% the
#: ramp reaches the seats on a host up to about 2x slower than in the sweep. The overload is
#: twice the top: at 1.5x it queued nothing where the sweep had met a slow host (its top
#: 18.9 req/s at TPOT p50 2.8 ms, the load's phases at 2.0-2.1 ms), no window broke the SLO
#: and the passive knee was the KV cache's, 18,366
TAIL = (("ramp", 0.5, 5.0), ("rise", 0.7, 5.0), ("near", 0.85, 5.0), ("top", 1.0, 5.0),
        ("over", 2.0, 8.0))
#: a 1 s slice in which processes outside the test took more than this share of the
#: server's core is the host's, not the engine's (:mod:`tests.agent.capacity_host`): it and
#: a second either side are left out of the twin's calibration and of the measured phases.
#: A run's low phase held 5 s of TTFT 60-130 ms and TPOT 7 ms (5-7 ms and 2 ms around them)
#: and the twin carried them to TTFT p90 +1,203% at the high rate
DISTURBED = 0.10
#: a phase whose TPOT p50 (vLLM's own timing) is more than this many times the median of
#: its kind's is a spell of the host's, out of the twin's calibration (a low phase) or of the
#: measurement (a high one), whole. This VM's speed moves from outside it, where
#: :data:`DISTURBED` does not see it: in one run two low phases of twelve decoded at TPOT p50
#: 2.8 ms against 1.8-2.2 in the others, one high phase at 2.8 against 1.9-2.5, and the twin,
#: carrying the low phases' spells to the high rate, put TPOT p90 +24.9% off (with them left
#: out of both: -10.0%; 1.2 and 1.3 leave the same phases out in 8 runs but one)
SPELL_RATIO = 1.25
#: seconds after the pairs before their calm time is judged: vLLM's exporter sends a batch
#: every 5 s, the collector writes every 1 s
LANDED_S = 6.5
#: calm seconds needed: of the low phases (60 s: about 210 requests at 15%), and of the high
#: phases' measured parts (48 s: about 410 at 30%), four fifths of each
CALM_LOW_S, CALM_HIGH_S = 48.0, 38.0
#: each high phase's first second is left out of its measurement (the batch climbs from
#: the low phase's in about one request's life, 0.3-0.5 s)
SETTLE_S = 1.0
#: the issue's bounds
KNEE_STEP = 2.0
TWIN_ERROR = 0.20
FIGURES = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


@dataclass
class Run:
    steps: list[Step]
    knee: Step
    passive: dict
    twin: dict
    measured_high: dict
    report: dict
    calm_s: tuple[float, float]  # calm seconds of the low phases, of the high measured


def _config(tmp: Path, name: str = "fleetlens.toml", extra: str = "") -> Path:
    path = tmp / name
    path.write_text(f"[pipeline]\nwindow_s = {WINDOW_S}\n[analytics]\nwindow_s = {WINDOW_S}\n"
                    + extra)
    return path


def _two_ports() -> dict[str, int]:
    """The collector's gRPC and HTTP ports, told apart: asked for one after the other, the
    OS once gave the same free port twice, the HTTP server took the agent's connections on
    it and nothing landed (UNIMPLEMENTED)."""
    grpc = free_port()
    http = free_port()
    while http == grpc:
        http = free_port()
    return {"grpc_port": grpc, "http_port": http}


def _calm(host: HostSampler, spans: dict, slow: Collection[str] = ()) -> tuple[list, list]:
    """The calm parts of the low phases and of the high phases' measured parts, the
    ``slow`` phases (:data:`SPELL_RATIO`) left out whole."""
    kept = {k: v for k, v in spans.items() if k not in slow}
    high = [(lo + int(SETTLE_S * NS), hi) for lo, hi in _of(kept, "high")]
    pairs = [*_of(spans, "low"), *_of(spans, "high")]
    return (host.calm(_of(kept, "low"), DISTURBED, pairs),
            host.calm(high, DISTURBED, pairs))


def _seconds(spans: list[tuple[int, int]]) -> float:
    return sum(hi - lo for lo, hi in spans) / NS


def _slow(data: DataDir, spans: dict) -> list[str]:
    """The low and high phases the host ran slow in (:data:`SPELL_RATIO`), of those whose
    requests' spans landed."""
    paired = {k: v for k, v in spans.items() if k.rstrip("0123456789") in ("low", "high")}
    return slow_phases(data, paired, SPELL_RATIO)


def _load(port: int, rng: random.Random, make, top: float, host: HostSampler,  # noqa: ANN001
          data: DataDir) -> tuple[dict, int]:
    """The phases sent (:data:`PAIRS`, more while the host was busy or ran slow,
    :data:`TAIL`): their wall-clock spans by name, and the requests sent."""
    spans: dict = {}
    sent = 0

    def send(phases: list[tuple[str, float, float]]) -> None:
        nonlocal sent
        plan, timeline = phase_plan(rng, [Phase(n, f * top, s) for n, f, s in phases], make)
        # the pairs start on window edges: each low phase is whole windows of the cut
        time.sleep(-time.time() % WINDOW_S)
        timeline.send(port, plan)
        spans.update(timeline.spans)
        sent += len(plan)

    def pair(k: int) -> list[tuple[str, float, float]]:
        return [(f"low{k}", *LOW), (f"high{k}", *HIGH)]

    # a first window at the low rate, judged nowhere: the run's first seconds were slower
    # (TPOT 3.5-4.8 ms for 10 s against 1.7-2.0 after, nothing else on the core): the
    # collector's first writes, the agent's first exports
    send([("warm", *LOW), *(p for k in range(1, PAIRS + 1) for p in pair(k))])
    for k in range(PAIRS + 1, PAIRS + MORE_PAIRS + 1):
        # the last phase's spans landed (vLLM's exporter sends a batch every 5 s, the
        # collector writes every 1 s) and a host sample came after its end
        time.sleep(LANDED_S)
        low, high = _calm(host, spans, _slow(data, spans))
        if _seconds(low) >= CALM_LOW_S and _seconds(high) >= CALM_HIGH_S:
            break
        send(pair(k))
    # from a window edge too: a near phase split across two windows showed batch 4.8 in the
    # first, and the knee (the largest batch below the overload's) came out 4.8 against 8
    send(list(TAIL))
    return spans, sent


def _of(timeline_spans: dict, kind: str) -> list[tuple[int, int]]:
    """The wall-clock spans of the phases named ``kind`` + a number, in time order."""
    return sorted(tuple(v) for k, v in timeline_spans.items()
                  if k.rstrip("0123456789") == kind)


def _measured(data: DataDir, spans: list[tuple[int, int]]) -> dict:
    """TTFT and TPOT p50/p90 of the requests that arrived in the [lo, hi) ``spans``, as the
    pipeline measured them (the figures the twin's ``measured`` row uses)."""
    arrived = pl.any_horizontal([pl.col(c.ARRIVAL_NS).is_between(lo, hi, closed="left")
                                 for lo, hi in spans])
    rows = (scan(data, t.REQUESTS).filter(arrived & ~pl.col(c.IS_ERROR).fill_null(False))
            .select(c.TTFT_S, c.TPOT_S).collect())
    out = {"requests": rows.height}
    for col in (c.TTFT_S, c.TPOT_S):
        for q in (0.5, 0.9):
            out[f"{col[:-2]}_p{int(q * 100)}_s"] = rows[col].quantile(q, "linear")
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("vllm-capacity")
    started = time.monotonic()
    python = ensure_vllm_venv()
    model = build_tiny_model(python, tmp / "tiny")
    data = DataDir(tmp / "data")
    rng = random.Random(31)

    def make(at: float) -> Request:
        return Request(at, prompt_of(rng, PROMPT_WORDS), SHAPE.max_tokens)

    report: dict = {}
    with contextlib.ExitStack() as stack:
        col = stack.enter_context(running_collector(data.root, config={"flush_interval_s": 1.0},
                                                    **_two_ports()))
        server = stack.enter_context(running_vllm(
            python, model, tmp / "vllm.log", port=free_port(), otlp_endpoint=col.grpc_address,
            service_name="vllm-capacity", extra_env=EXPORTER_ENV,
            resource_attributes={a.SERVICE_INSTANCE_ID: INSTANCE, a.HOST_NAME: HOST},
            args=["--max-num-seqs", str(SEATS), "--max-model-len", str(SHAPE.max_model_len)]))
        report["server_start_s"] = round(time.monotonic() - started, 1)
        warm_up = sweep(server.port, make, SEATS, 1.0, 4)  # left out
        t0 = time.monotonic()
        steps = sweep(server.port, make, SEATS, STEP_S, 4 * SEATS)
        report["sweep_s"] = round(time.monotonic() - t0, 1)
        top = max(s.rps for s in steps)
        host = stack.enter_context(HostSampler())
        with running_agent(tmp, col.grpc_address, server.url, INSTANCE, HOST) as agent:
            time.sleep(2.0)  # the agent's first scrapes of the idle engine
            report["agent_settle_s"] = round(settle(agent.pid), 1)
            t0 = time.monotonic()
            spans, load = _load(server.port, rng, make, top, host, data)
            report["load_s"] = round(time.monotonic() - t0, 1)
            time.sleep(2.0)  # the agent's scrapes of the drained engine
        sent = sum(len(s.requests) + s.discarded for s in (*warm_up, *steps))
        report["spans_landed"] = wait_for_spans(data, sent + load, settle_s=10.0)
    fractions = {"warm": LOW[0], "low": LOW[0], "high": HIGH[0], **{n: f for n, f, _ in TAIL}}
    report["rates"] = {n: round(fractions[n.rstrip("0123456789")] * top, 2) for n in spans}
    # what else ran on the server's core, per phase (share of it)
    report["others"] = {n: round(host.others(*span) or 0.0, 3) for n, span in spans.items()}
    report["slow_phases"] = slow = _slow(data, spans)
    calm_low, calm_high = _calm(host, spans, slow)
    report["calm_s"] = {"low": round(_seconds(calm_low), 1), "of_low": _seconds(_of(spans, "low")),
                        "high": round(_seconds(calm_high), 1)}
    # for re-analysing the data dir (a changed estimator judged again on the same telemetry)
    (tmp / "phases.json").write_text(json.dumps({
        "phases": spans, "rates": report["rates"], "calm_low": calm_low,
        "calm_high": calm_high, "others": report["others"], "slow": slow,
        "sweep": [[s.concurrency, s.start_ns, s.end_ns] for s in steps]}))
    step_latencies(data, steps)
    slo = CapacityConfig()
    knee = sweep_knee(steps, slo.tpot_ratio, slo.ttft_p99_s)
    config = _config(tmp)
    t0 = time.monotonic()
    analysed(data, config)
    passive = capacity_rows(data, config)
    low = _of(spans, "low")
    calibration = cut_spans(data, tmp / "low", calm_low)
    # the twin is calibrated on the requests; the cut's capacity row gives it the pool (its
    # hardware and SLOs) and needs a knee, which a cut with a disturbed second taken out
    # may have fewer than the default 8 windows for
    low_config = _config(tmp, "low.toml", "[analytics.capacity]\nmin_windows = 4\n")
    analysed(calibration, low_config)
    factor = HIGH[0] / LOW[0]
    hours = (low[-1][1] - low[0][0]) / NS / 3600
    twin = capacity_rows(calibration, low_config, "--what-if",
                         f"rate={factor:g},max_num_seqs={SEATS}", "--hours", f"{hours:.6f}")
    measured_high = _measured(data, calm_high)
    report["analysis_s"] = round(time.monotonic() - t0, 1)
    result = Run(steps, knee, passive[0] if len(passive) == 1 else {"rows": passive},
                 {r["row"]: r for r in twin}, measured_high, report,
                 (_seconds(calm_low), _seconds(calm_high)))
    yield result
    report["total_s"] = round(time.monotonic() - started, 1)
    print("\nvLLM capacity run:", json.dumps({
        **report, "sweep": [s.figures for s in steps], "sweep_knee_batch": knee.batch,
        "sweep_repeated": [s.concurrency for s in steps if s.discarded],
        "passive": {k: result.passive.get(k) for k in (
            c.KNEE_BATCH, c.KNEE_LIMIT, "knee_batch_lo", "knee_batch_hi", "knee_rps",
            "batch_min", "batch_max", "windows_used", "tpot_slo_s", "tpot_batch1_s",
            c.GOODPUT_RPS_PER_GPU, c.GOODPUT_NOW_RPS_PER_GPU, c.RPS_NOW)},
        **{name: {k: result.twin.get(row, {}).get(k) for k in ("requests", *FIGURES)}
           for name, row in (("twin", "twin (what-if)"), ("twin_present", "twin (present)"),
                             ("measured_low", "measured"))},
        "measured_high": measured_high}, default=str))


def test_the_sweep_rises_until_the_seats_are_full(run: Run) -> None:
    """The physics the knee rests on: below the seats each doubling of the concurrency
    raises throughput (by 20% at least; a step time flat in the batch doubles it)."""
    below = [s for s in run.steps if s.concurrency <= SEATS]
    gains = [b.rps / a.rps - 1 for a, b in zip(below, below[1:], strict=False)]
    assert min(gains) > 0.2, [s.figures for s in run.steps]


def test_the_passive_knee_is_within_one_step_of_the_sweeps(run: Run) -> None:
    knee = run.passive.get(c.KNEE_BATCH)
    assert knee is not None, run.passive
    assert run.knee.batch / KNEE_STEP <= knee <= run.knee.batch * KNEE_STEP, (
        f"passive knee {knee:.2f} ({run.passive.get(c.KNEE_LIMIT)}), sweep's {run.knee.batch}: "
        f"{[s.figures for s in run.steps]}")


def test_goodput_counts_the_requests_meeting_the_slos(run: Run) -> None:
    """The agent's requests carry a null ``gpu_model`` on a CPU engine: goodput was 0.00
    in every window while their join shadowed the pool's. Now: good requests exist, and no
    more than were sent per second over the last 15 minutes (the whole run here)."""
    now = run.passive.get(c.GOODPUT_NOW_RPS_PER_GPU)
    at_knee = run.passive.get(c.GOODPUT_RPS_PER_GPU)
    assert now is not None and now > 0, run.passive
    assert now <= run.passive[c.RPS_NOW] * 1.0001, run.passive
    assert at_knee is not None and 0 < at_knee <= run.passive[c.KNEE_RPS] * 1.0001, run.passive


def test_the_twin_calibrated_on_the_low_rate_predicts_the_high_rate(run: Run) -> None:
    """The issue's bound on TTFT and TPOT p50/p90 (the twin's own present is printed), on
    the calm parts of the phases; a host too busy to leave enough of them fails as such."""
    low_s, high_s = run.calm_s
    assert low_s >= CALM_LOW_S and high_s >= CALM_HIGH_S, (
        f"the host was busy: {low_s:.0f} s of the low phases and {high_s:.0f} s of the high "
        f"ones calm (other processes under {DISTURBED:.0%} of the server's core, phases "
        f"the host ran slow in out: {run.report['slow_phases']}), {CALM_LOW_S:.0f} and "
        f"{CALM_HIGH_S:.0f} needed; per phase {run.report['others']}")
    predicted = run.twin["twin (what-if)"]
    errors = {f: predicted[f] / run.measured_high[f] - 1 for f in FIGURES
              if predicted[f] is not None and run.measured_high[f]}
    assert len(errors) == len(FIGURES), (run.twin, run.measured_high)
    missed = {f: f"{e:+.0%}" for f, e in errors.items() if abs(e) > TWIN_ERROR}
    assert not missed, (f"twin off by more than {TWIN_ERROR:.0%}: {missed}; twin "
                        f"{[round(predicted[f] * 1e3, 2) for f in FIGURES]} ms, measured "
                        f"{[round(run.measured_high[f] * 1e3, 2) for f in FIGURES]} ms; "
                        f"others' share of the core per phase {run.report['others']}")
