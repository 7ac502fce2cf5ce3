"""Issue 31 on a real vLLM (the CPU build, the tiny model): the passive knee that
``fleetlens capacity`` estimates from production-like telemetry against an active sweep's,
and the calibrated twin (``fleetlens capacity --what-if``) against a run at a higher rate.

One server with ``--max-num-seqs`` :data:`SEATS` and :data:`SHAPE`'s answers:

1. the active sweep (:func:`tests.agent.capacity_run.sweep`), before the agent runs, so
   its windows are not elasticity points of the passive estimate: closed-loop concurrency
   1, 2, 4, ... until throughput stops rising. Its knee is judged by the passive
   estimator's own default SLO (TPOT p99 at most 1.5x its batch-1 value, TTFT p99 at most
   2 s) from vLLM's own timings of each step, and stated as the batch it ran;
2. the agent scrapes, and open-loop Poisson load varies as a day would
   (:mod:`tests.agent.capacity_load`), in fractions of the sweep's top throughput:
   :data:`LOW` and :data:`HIGH` alternating every window
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
that found it idle (those that found it busy: their own, less half a step), each step
as slow as the requests it carries ran, and an idle engine's slower first step (its wake,
3.8 ms against 2.3 on this engine) added to the steps it starts from idle.

Margins: the issue's own for the knee (within one step of the sweep's grid: a factor 2)
and the twin (TTFT and TPOT p50/p90 within 20%). The sweep's knee is the last step within
the SLO before two steps in a row break it (:func:`capacity_run.sweep_knee`). Mine: the
sweep stops when a doubling gains under 10% (:data:`capacity_run.MIN_GAIN`), and below the
seats each doubling must gain 20% (a flat step time doubles it: 47-121% measured). Every
figure is printed, with the requests each percentile is of. About 3.8 minutes on one
core (server start ~35 s, sweep ~16 s, load ~165 s, analysis ~5 s), in ``make test``'s
real-vLLM part (its figures per run: docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Iterator
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
from tests.agent.capacity_load import (
    CALM_HIGH_S,
    CALM_LOW_S,
    DISTURBED,
    HIGH,
    LOW,
    TAIL,
    WINDOW_S,
    calm,
    phases_of,
    ran_slow,
    seconds,
    send_load,
)
from tests.agent.capacity_run import (
    NS,
    Step,
    analysed,
    capacity_rows,
    cut_spans,
    step_latencies,
    sweep,
    sweep_knee,
)
from tests.agent.incident_load import PROMPT_WORDS, Shape
from tests.agent.incident_run import running_agent, wait_for_spans
from tests.agent.loadgen import Request, prompt_of
from tests.agent.vllm_env import build_tiny_model, ensure_vllm_venv, free_port, running_vllm
from tests.agent.vllm_scenario import EXPORTER_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOST = "capacity-host"
INSTANCE = f"{HOST}/tiny-0"
SEATS = 8

#: 136-token answers (two cache blocks): short requests, many per 10 s window
SHAPE = Shape(blocks=2)

#: seconds per sweep step: a closed loop's throughput is its clients over their latency,
#: which a few requests tell (about 7 at concurrency 1)
STEP_S = 3.0

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
            spans, load = send_load(server.port, rng, make, top, host, data)
            report["load_s"] = round(time.monotonic() - t0, 1)
            time.sleep(2.0)  # the agent's scrapes of the drained engine
        sent = sum(len(s.requests) + s.discarded for s in (*warm_up, *steps))
        report["spans_landed"] = wait_for_spans(data, sent + load, settle_s=10.0)
    fractions = {"warm": LOW[0], "low": LOW[0], "high": HIGH[0], **{n: f for n, f, _ in TAIL}}
    report["rates"] = {n: round(fractions[n.rstrip("0123456789")] * top, 2) for n in spans}
    # what else ran on the server's core, per phase (share of it)
    report["others"] = {n: round(host.others(*span) or 0.0, 3) for n, span in spans.items()}
    report["slow_phases"] = slow = ran_slow(data, spans)
    calm_low, calm_high = calm(host, spans, slow)
    report["calm_s"] = {"low": round(seconds(calm_low), 1),
                        "of_low": seconds(phases_of(spans, "low")),
                        "high": round(seconds(calm_high), 1)}
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
    low = phases_of(spans, "low")
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
                 (seconds(calm_low), seconds(calm_high)))
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
