"""The load of the real-vLLM capacity check (``tests/agent/test_vllm_capacity.py``, issue 31):
open-loop Poisson phases in fractions of the sweep's top throughput, and which of their
seconds are calm enough to judge the twin on.

:func:`send_load` sends one unjudged low window, :data:`PAIRS` pairs of a low and a high phase
(more while the host was busy or ran slow: :func:`calm`), then :data:`TAIL`. A phase is
calm where no other process took the server's core (:mod:`tests.agent.capacity_host`) and
the host did not run it slow (:func:`ran_slow`, from vLLM's own spans that landed).
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection

from fleetlens.pipeline.storage import DataDir
from tests.agent.capacity_host import HostSampler
from tests.agent.capacity_run import NS, slow_phases
from tests.agent.incident_run import Phase, phase_plan

#: 5 s windows: the low phase's 45 s give 9, one more than ``min_windows`` (8) with the
#: window edges off the phase's (10 s windows needed a 90 s phase)
WINDOW_S = 5

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
#: 32 s of them calm). With 8 pairs (129-156 calibration requests, 244-292 measured) the
#: twin's TTFT p90 missed in 2 of 5 calm runs (-20% and -25%) while the measured one moved
#: 6.4-11.0 ms from run to run: a p90 of 150 requests rests on its 15 slowest
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


def calm(host: HostSampler, spans: dict, slow: Collection[str] = ()) -> tuple[list, list]:
    """The calm parts of the low phases and of the high phases' measured parts, the
    ``slow`` phases (:data:`SPELL_RATIO`) left out whole."""
    kept = {k: v for k, v in spans.items() if k not in slow}
    high = [(lo + int(SETTLE_S * NS), hi) for lo, hi in phases_of(kept, "high")]
    pairs = [*phases_of(spans, "low"), *phases_of(spans, "high")]
    return (host.calm(phases_of(kept, "low"), DISTURBED, pairs),
            host.calm(high, DISTURBED, pairs))


def seconds(spans: list[tuple[int, int]]) -> float:
    """The length of ``[lo, hi)`` ns spans, in seconds."""
    return sum(hi - lo for lo, hi in spans) / NS


def ran_slow(data: DataDir, spans: dict) -> list[str]:
    """The low and high phases the host ran slow in (:data:`SPELL_RATIO`), of those whose
    requests' spans landed."""
    paired = {k: v for k, v in spans.items() if k.rstrip("0123456789") in ("low", "high")}
    return slow_phases(data, paired, SPELL_RATIO)


def send_load(port: int, rng: random.Random, make, top: float,  # noqa: ANN001
              host: HostSampler, data: DataDir) -> tuple[dict, int]:
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
        low, high = calm(host, spans, ran_slow(data, spans))
        if seconds(low) >= CALM_LOW_S and seconds(high) >= CALM_HIGH_S:
            break
        send(pair(k))
    # from a window edge too: a near phase split across two windows showed batch 4.8 in the
    # first, and the knee (the largest batch below the overload's) came out 4.8 against 8
    send(list(TAIL))
    return spans, sent


def phases_of(timeline_spans: dict, kind: str) -> list[tuple[int, int]]:
    """The wall-clock spans of the phases named ``kind`` + a number, in time order."""
    return sorted(tuple(v) for k, v in timeline_spans.items()
                  if k.rstrip("0123456789") == kind)
