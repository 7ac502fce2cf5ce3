"""The simulator's own knee, measured on what it executes: an active sweep of steady rates.

The knee the capacity estimator is judged against must be the simulator's truth, not a model
of it. A closed-form mean-step model (:func:`tests.analytics.capacity_sim.roofline_truth`)
leaves out what the engine's scheduler does: prompts that arrive during a long mixed step
are all admitted into the next one, so their prefill compute shares one memory-bound step
instead of each hiding under its own (the main term: +1.5-5% step time at 50-110 sequences on
Llama-3.1-70B/H200 TP2), and a running sequence holds more KV than ``prompt + output / 2``
(long outputs stay longer: ``E[o^2] / 2E[o]``). So the reference here runs the same fleet
(same hardware, model, lengths and seed; no telemetry built) at constant arrival rates, and
reads, per run, from the simulator's own request timing (never its telemetry):

- the running batch per instance: the time average of admitted, unfinished requests
  (``scheduled_t`` to ``last_token_t``; vLLM's ``num_requests_running``);
- TPOT p50: the median over requests of (last token - first token) / (output - 1).

The knee is the batch (and the arrival rate per instance) where TPOT p50 reaches ``ratio``
x its value at batch 1, interpolated between the two bracketing rates of a bisection.
"""

from __future__ import annotations

import copy
import multiprocessing
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from fleetlens.simulator import parse_scenario
from fleetlens.simulator.run import run

#: seconds of each steady run; the first :data:`WARM_S` are not measured (the batch builds)
STEADY_S, WARM_S = 600.0, 60.0
#: bisection rounds on the arrival rate (the bracket shrinks to 1/2^ROUNDS of its width)
ROUNDS = 7
T = TypeVar("T")


@dataclass(frozen=True)
class Steady:
    """One steady run: per instance, its mean running batch, arrival rate and TPOT p50."""

    rate: float  # req/s to the whole fleet
    batch: float
    rps: float
    tpot_p50: float


@dataclass(frozen=True)
class Truth:
    """The simulator's knee: batch, one instance's arrival rate, per GPU; the runs it came
    from (``runs``) and the TPOT p50 at batch 1 the SLO is a multiple of."""

    knee_batch: float
    knee_rps: float
    rps_per_gpu: float
    tpot_batch1: float
    runs: tuple[Steady, ...]


def steady(doc: dict, rate: float) -> Steady:
    """Run the fleet of ``doc`` at a constant ``rate`` (req/s), its incidents removed."""
    doc = copy.deepcopy(doc)
    doc["incident"] = []
    doc["workload"][0]["rate"] = rate
    doc["fleet"]["duration_s"] = STEADY_S
    finished: list = []
    run(parse_scenario(doc), export=False, probe=lambda _inst, reqs: finished.extend(reqs))
    instances = len({id(r.instance) for r in finished})
    lo, hi = WARM_S, STEADY_S
    busy = sum(max(0.0, min(r.last_token_t, hi) - max(r.scheduled_t, lo)) for r in finished)
    tpots = [(r.last_token_t - r.first_token_t) / (r.out_target - 1) for r in finished
             if r.out_target > 1 and lo <= r.first_token_t and r.last_token_t <= hi]
    arrived = sum(1 for r in finished if lo <= r.queued_t < hi)
    return Steady(rate, busy / (hi - lo) / instances, arrived / (hi - lo) / instances,
                  statistics.median(tpots))


def steady_truth(doc: dict, tp: int, top_rate: float, ratio: float = 1.5) -> Truth:
    """The knee of ``doc``'s fleet (module docstring); ``top_rate`` (req/s to the fleet) must
    be past it. Batch 1: a run at the rate that Little's law says holds one sequence per
    instance (from a run at a twentieth of ``top_rate``)."""
    probe = steady(doc, top_rate / 20.0)
    one = steady(doc, probe.rate / probe.batch)
    limit = ratio * one.tpot_p50
    runs = [probe, one]
    lo, hi = one, steady(doc, top_rate)
    runs.append(hi)
    if hi.tpot_p50 <= limit:
        raise ValueError(f"top rate {top_rate} is not past the knee: {hi}")
    for _ in range(ROUNDS):
        mid = steady(doc, (lo.rate + hi.rate) / 2.0)
        runs.append(mid)
        lo, hi = (mid, hi) if mid.tpot_p50 <= limit else (lo, mid)
    share = (limit - lo.tpot_p50) / (hi.tpot_p50 - lo.tpot_p50)
    batch = lo.batch + share * (hi.batch - lo.batch)
    rps = lo.rps + share * (hi.rps - lo.rps)
    return Truth(batch, rps, rps / tp, one.tpot_p50, tuple(runs))


def in_fresh_interpreter(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a spawned interpreter. The sweep allocates millions of objects, and
    the garbage collections they set off in a pytest process that has run the rest of the
    suite crashed once (SIGSEGV while collecting, in a pure-Python line of the simulator:
    an object some C extension left broken); a fresh interpreter holds only the simulator."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()
