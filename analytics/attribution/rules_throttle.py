"""Scoring rules for the throttles: thermal throttle and power cap.

Each needs its own mechanism signal: a thermal throttle the thermal reason bits with the
temperature up, a power cap a lower limit or the power-cap bits (a clock drop at the limit
counts only where the agent reports no reason bits at all: with bits reported and none set,
the clock drop has another cause); and a throttle slows a GPU through its clock, so it
scores only as far as its clock drop explains the slowdown (:func:`clock_explains`).
"""

from __future__ import annotations

import math
import statistics

from fleetlens.analytics.attribution.rules import (
    Candidate,
    Facts,
    clip01,
    demand_strength,
    gpu_place,
    long_prompt_strength,
    surge_strength,
    weigh,
)
from fleetlens.analytics.attribution.signals import delta, ratio, value
from fleetlens.pipeline.schema import Cause
from fleetlens.pipeline.schema import columns as c


def where(subject: str) -> str:
    """The value part of a subject (``gpu_uuid=GPU-1`` -> ``GPU-1``)."""
    return subject.split("=", 1)[1]


def reasons_known(s: dict) -> bool:
    """Whether the agent reported clock-event reason bits for this GPU at all."""
    return value(s.get("reasons_known")) >= 0.5


def measured(pair) -> bool:  # noqa: ANN001 - a signal Pair
    """Whether a (baseline, incident) signal pair has both sides."""
    return bool(pair) and pair[0] is not None and pair[1] is not None


def clock_explains(f: Facts, gpu: str) -> float:
    """How much of the slowdown the GPU's clock drop can explain (0..1): a throttle slows a
    GPU through its clock, so a clock 3% down cannot be why decode got 5x slower. A GPU
    that is slow for another reason (a straggler, a stalled link) and busier draws more
    power and trips the power-cap bits now and then; those bits are then a symptom, not the
    cause. In log terms (1/clock against the slowdown); queueing and bigger batches add to
    a real throttle's slowdown, so a third explained counts in full. 1 where the
    slowdown or the clock is not measured, or there is no slowdown to explain."""
    s = f.signals.gpus.get(gpu, {})
    if not measured(s.get("sm_clock")):
        return 1.0
    own = s if ("tpot" in s or "prefill_per_token" in s) else f.signals.hosts.get(
        f.signals.gpu_host.get(gpu, ""), {})
    slower = slowdown(own)
    if slower <= 1.1:
        return 1.0
    explained = math.log(1 / max(ratio(s.get("sm_clock")), 0.05)) / math.log(slower)
    return clip01(explained / 0.3)


def thermal_strength(f: Facts, gpu: str) -> float:
    """Thermal reason bits set more often with the temperature up (where temperature is
    measured); without reported bits, the clock down while the temperature rose; as far
    as the clock drop explains the slowdown (:func:`clock_explains`)."""
    s = f.signals.gpus.get(gpu, {})
    temp = s.get("temp")
    hotter = clip01(delta(temp) / 5) if measured(temp) else 1.0
    if reasons_known(s):
        return clip01(delta(s.get("thermal_frac")) / 0.5) * hotter * clock_explains(f, gpu)
    clock_drop = 1 - ratio(s.get("sm_clock"))
    return clip01(clock_drop / 0.2) * clip01(delta(temp) / 10) * clock_explains(f, gpu)


def load_explains_draw(f: Facts) -> float:
    """How far more demand explains a GPU drawing more power (0..1): at an unchanged limit,
    more or longer requests make a GPU work harder and reach its limit more often. Random
    fleet 14007 (an L4 at 72 W): a natural 1.8x surge set the power-cap bits in 88% of
    samples instead of 30% and took 13% off the clock, and power_cap ranked first, over the
    surge, four times in one clean run."""
    return max(surge_strength(f), long_prompt_strength(f), demand_strength(f))


def power_strength(f: Facts, gpu: str) -> float:
    """A lower power limit or the power-cap bits set more often; without reported bits, the
    clock down while the power is held at the limit; as far as the clock drop explains the
    slowdown (:func:`clock_explains`). Evidence at an unchanged limit counts only as far as
    the demand does not explain it (:func:`load_explains_draw`)."""
    s = f.signals.gpus.get(gpu, {})
    limit = clip01((1 - ratio(s.get("power_limit"))) / 0.2)
    clock_drop = 1 - ratio(s.get("sm_clock"))
    if reasons_known(s):
        # Bits set more often at an unchanged limit and a clock barely down: a GPU whose
        # limit is always near its draw (an L4 at 72 W) trips them more when it works
        # harder; that costs what the clock lost, no more (full strength from 15% down).
        at_limit = clip01(delta(s.get("power_cap_frac")) / 0.5) * clip01(clock_drop / 0.15)
    else:
        held = 1.0 if value(s.get("power_vs_limit")) >= 0.95 else 0.0
        at_limit = clip01(clock_drop / 0.2) * held
    host = f.signals.gpu_host.get(gpu, "")
    at_limit *= (1 - load_explains_draw(f)) * (1 - PEER_DAMP * shared_by_peers(f, host))
    return max(limit, at_limit) * clock_explains(f, gpu)


def _host_part(f: Facts, host: str) -> float:
    """The part of a service-wide incident's excess carried by ``host``'s requests: one
    GPU's throttle explains at most its own host's share (1 for a host incident, or where
    the requests do not say)."""
    if f.ctx.host or not host:
        return 1.0
    part = f.excess_share(c.HOST_NAME, host)
    return 1.0 if part is None else part


def _gpu_candidate(f: Facts, cause: str, strength_of, describe) -> Candidate:
    per_gpu = {g: strength_of(f, g) for g in f.gpus()}
    subject, strength, host = gpu_place(f, per_gpu)
    gpu = max(per_gpu, key=per_gpu.__getitem__) if per_gpu else ""
    s = f.signals.gpus.get(gpu, {})
    share = f.share("prefill_rate", "decode", "queue") * _host_part(f, host)
    return Candidate(cause, subject, weigh(strength, share), share,
                     describe(f, subject, gpu, s, host),
                     {"gpu": gpu, "signals": s, "per_gpu_strength": per_gpu})


def thermal_throttle(f: Facts) -> Candidate:
    def describe(f, subject, gpu, s, host) -> str:
        return (f"SM clock {value(s.get('sm_clock'), 0):.0f} -> {value(s.get('sm_clock')):.0f}"
                f" MHz on {where(subject)}: thermal throttling in "
                f"{value(s.get('thermal_frac')):.0%} of samples at {value(s.get('temp')):.0f} C;"
                f" decode {f.ms('decode'):+.0f} ms, prefill {f.ms('prefill'):+.0f} ms")
    return _gpu_candidate(f, Cause.THERMAL_THROTTLE, thermal_strength, describe)


def power_cap(f: Facts) -> Candidate:
    def describe(f, subject, gpu, s, host) -> str:
        return (f"power limit {value(s.get('power_limit'), 0):.0f} -> "
                f"{value(s.get('power_limit')):.0f} W on {where(subject)}, power at "
                f"{value(s.get('power_vs_limit')):.0%} of limit, power-cap throttling in "
                f"{value(s.get('power_cap_frac')):.0%} of samples; SM clock "
                f"{value(s.get('sm_clock'), 0):.0f} -> {value(s.get('sm_clock')):.0f} MHz")
    return _gpu_candidate(f, Cause.POWER_CAP, power_strength, describe)


#: How much of a host-bound signature its peers share is discounted (a limit change, NCCL
#: logs and the like are not: they are the fault's own record).
PEER_DAMP = 0.8


def shared_by_peers(f: Facts, host: str) -> float:
    """How far ``host``'s slowdown is one the other hosts serving the same model share (0:
    none, or no peers; 1: they are as slow as it, by x1.5 or more). A fault of one host's
    GPUs or links leaves its siblings as fast as before, whatever the traffic does; a busier
    service slows every host at once (random fleet 29001: a natural x1.3 surge at capacity,
    every host's batches x2-7 and decode x1.4-6, read on each host as a collective stall or
    a power cap; 26006: a natural x1.4 burst on two L4 hosts, both x1.5 slower, read as a
    power cap). A peer that took load the slow host shed is slower too, but less: the
    part by which ``host`` is slower than its peers' median is kept."""
    own = f.signals.hosts.get(host, {})
    # A peer whose decode time per token reads 0 in the incident decoded nothing there (its
    # engine down or idle): it says nothing about a shared slowdown, and a median of 0 divided
    # by (random fleets 41010 and 41013 stopped their analytics run on it).
    peers = [x for x in (slowdown(v) for h, v in f.signals.hosts.items()
                         if h != host and measured(v.get("tpot"))) if x > 0]
    if not peers or not measured(own.get("tpot")):
        return 0.0
    typical = statistics.median(peers)
    alone = clip01((slowdown(own) / typical - 1.2) / 0.6)
    return clip01((typical - 1.1) / 0.4) * (1 - alone)


def slowdown(s: dict) -> float:
    """How much slower each token is: decode time per token where measured (prefill per
    uncached token only without it). Prefill per token also moves with the prompt mix
    (less prefix reuse, longer prompts), decode does not; and a decode that got faster is
    no evidence of a slower device, whatever prefill did."""
    if measured(s.get("tpot")):
        return ratio(s.get("tpot"))
    return ratio(s.get("prefill_per_token"))
