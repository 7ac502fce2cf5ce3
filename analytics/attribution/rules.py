"""One scoring rule per cause of the vocabulary, over phases, dimensions and signals.

Each rule returns a :class:`Candidate` with a strength in [0, 1] from its own mechanism
signal, *moved against the baseline* (arrivals up, KV cache filled and preempting, prefix
hit rate down, prompts longer, thermal or power-cap reason bits, a lower power limit...):
a cause whose signal did not move scores 0, and one whose signal moved the wrong way (a slow
GPU while decode got faster) is ruled out. The strength is weighted by the share of the
excess lying in the parts that mechanism produces (:func:`weigh`), so of two causes with
evidence the one explaining more of the excess ranks higher. Rules that share a symptom
discount each other: a traffic surge also fills the KV cache, so KV pressure with a surge
counts less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fleetlens.analytics.attribution.context import IncidentContext
from fleetlens.analytics.attribution.dimensions import Finding
from fleetlens.analytics.attribution.phases import PhaseSplit
from fleetlens.analytics.attribution.signals import (
    CACHED_PER_S,
    PREFIX_HITS_PER_S,
    Pair,
    Signals,
    delta,
    ratio,
    value,
)
from fleetlens.pipeline.schema import Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.bursts import BURST_RATIO
from fleetlens.pipeline.schema.causes import subject as fmt_subject

#: Score floor for a cause with evidence but little measured excess in its phases; small
#: so that a cause explaining most of the excess outranks one explaining little of it.
SHARE_FLOOR = 0.1
CROWDED_DAMP = 0.8
#: least part of the demand's growth (in log terms) the arrivals carry for a surge of
#: demand to be a traffic surge (:func:`rate_led_demand`)
SURGE_RATE_PART = 0.4
#: The arrivals' surge strength ramps from here (x the usual; cut below a burst) to full at
#: SURGE_FULL_RATIO.
SURGE_RAMP_FROM = 1.25
SURGE_FULL_RATIO = 2.25
#: more requests waiting on the scope's engines than in the baseline for an overload to be
#: full (:func:`overload_strength`)
OVERLOAD_QUEUE = 10.0


def clip01(x: float) -> float:
    return 0.0 if x != x else max(0.0, min(1.0, x))  # NaN -> 0


def weigh(strength: float, share: float) -> float:
    """Score of a cause: its evidence strength times the share of the excess it explains."""
    return strength * (SHARE_FLOOR + (1 - SHARE_FLOOR) * share)


@dataclass
class Candidate:
    """One ranked cause before it becomes a `causes` row."""

    cause: str
    subject: str
    score: float
    share_of_excess: float
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Facts:
    """The three analyses of one incident."""

    ctx: IncidentContext
    phases: PhaseSplit
    findings: list[Finding]
    signals: Signals

    @property
    def service(self) -> str:
        return self.ctx.incident[c.SERVICE_NAME]

    def service_subject(self) -> str:
        return fmt_subject(c.SERVICE_NAME, self.service)

    def hosts(self) -> list[str]:
        """Hosts a host-bound cause may be on: the incident's, or every host of the scope."""
        return [self.ctx.host] if self.ctx.host else sorted(self.signals.hosts)

    def all_hosts(self) -> list[str]:
        """Every host of the incident's service/model with signals (for spread checks)."""
        return sorted(set(self.signals.hosts) | set(self.hosts()))

    def gpus(self) -> list[str]:
        hosts = set(self.hosts())
        return sorted(g for g, h in self.signals.gpu_host.items() if h in hosts)

    def ms(self, phase: str) -> float:
        return self.phases.excess_s.get(phase, 0.0) * 1000

    def share(self, *phases: str) -> float:
        """Share of the excess in ``phases`` (phases or parts such as ``prefill_rate``)."""
        return min(1.0, sum(self.phases.share.get(p, self.phases.parts.get(p, 0.0))
                            for p in phases))

    def busier(self) -> float:
        """How much busier the scope's GPUs got (0: as before, 1: utilisation x1.15 or
        more): extra work of the traffic itself slows every token, on every GPU."""
        gpus = [g for g in self.gpus() if g in self.signals.gpus]
        if not gpus:
            return 0.0
        util = sum(ratio(self.signals.gpus[g].get("util")) for g in gpus) / len(gpus)
        return clip01((util - 1) / 0.15)

    def power_kept(self) -> float:
        """How far the scope's GPUs drew as much power as before (0: x0.9 or less, 1: x0.98
        or more; 1 where no GPU reports power: nothing says they did less). A GPU waiting
        on a link, a throttled or a slower one draws less; one serving more arrivals
        does not."""
        pairs = [self.signals.gpus[g].get("power") for g in self.gpus() if g in self.signals.gpus]
        ratios = [ratio(p) for p in pairs if p and p[0] and p[1] is not None]
        if not ratios:
            return 1.0
        return clip01((sum(ratios) / len(ratios) - 0.9) / 0.08)

    def running_ratio(self, hosts: list[str] | None = None) -> float:
        """Incident/baseline running requests summed over ``hosts`` (all by default)."""
        pairs = [self.signals.hosts.get(h, {}).get("running")
                 for h in (hosts if hosts is not None else list(self.signals.hosts))]
        pairs = [p for p in pairs if p and p[0] is not None and p[1] is not None]
        return ratio((sum(p[0] for p in pairs), sum(p[1] for p in pairs))) if pairs else 1.0

    def excess_share(self, dimension: str, value_: str) -> float | None:
        for f in self.findings:
            if f.dimension == dimension and f.value == value_:
                return f.share_of_excess
        return None


def place(facts: Facts, strengths: dict[str, float]) -> tuple[str, float]:
    """Subject for a per-host strength map: the host, or the service when the signal is
    spread over at least two and half of its hosts (even if only one host's latency
    breached: a service-wide cause hurts the busiest host first). The strength returned is
    the incident host's, for a host incident."""
    if not strengths:
        return facts.service_subject(), 0.0
    best = facts.ctx.host if facts.ctx.host in strengths else max(
        strengths, key=strengths.__getitem__)
    top = max(strengths.values())
    own = strengths[best]
    strong = [h for h, s in strengths.items() if s >= 0.5 * top and top > 0]
    if len(strong) >= 2 and len(strong) >= 0.5 * len(strengths) and best in strong:
        return facts.service_subject(), own
    return fmt_subject(c.HOST_NAME, best), own


def gpu_place(facts: Facts, strengths: dict[str, float]) -> tuple[str, float, str | None]:
    """Subject for a per-GPU strength map: one GPU, its whole host, or the service."""
    if not strengths:
        return facts.service_subject(), 0.0, None
    best = max(strengths, key=strengths.__getitem__)
    top = strengths[best]
    host = facts.signals.gpu_host.get(best)
    strong = [g for g, s in strengths.items() if top > 0 and s >= 0.5 * top]
    strong_hosts = {facts.signals.gpu_host.get(g) for g in strong}
    if len(strong_hosts) > 1 and not facts.ctx.host:
        by_host = {h: max(strengths[g] for g in strong if facts.signals.gpu_host.get(g) == h)
                   for h in strong_hosts if h}
        subject, _ = place(facts, by_host)
        return subject, top, host
    on_host = [g for g, h in facts.signals.gpu_host.items() if h == host]
    if host and len(on_host) > 1 and set(on_host) <= set(strong):
        return fmt_subject(c.HOST_NAME, host), top, host
    return fmt_subject(c.GPU_UUID, best), top, host


def _focus(f: Facts, per_host: dict[str, float]) -> str:
    """The host whose signals a summary quotes: the incident's, else the strongest."""
    if f.ctx.host:
        return f.ctx.host
    return max(per_host, key=per_host.__getitem__) if per_host else ""


def _where(subject: str) -> str:
    return subject.split("=", 1)[1] if "=" in subject else subject


def traffic_surge(f: Facts) -> Candidate:
    rps = f.signals.scope.get("rps")
    r = ratio(rps)
    by_rate = surge_strength(f)
    by_demand = rate_led_demand(f)
    overload = overload_strength(f)
    strength = max(by_rate, by_demand, overload)
    waiting = sum(value(v.get("waiting")) for v in f.signals.hosts.values())
    # More requests wait (queue) and, once admitted, share bigger batches: each token is
    # slower in proportion to how much the running batch grew.
    batch = clip01((f.running_ratio() - 1) / 0.25)
    share = min(1.0, f.share("queue") + batch * f.share("decode", "prefill_rate"))
    demand = ""
    if by_demand > by_rate:
        tokens = f.signals.scope.get(c.INPUT_TOKENS)
        demand = (f"; demand x{demand_ratio(f):.1f} tokens/s with prompts "
                  f"x{ratio(tokens):.1f}")
    if overload > max(by_rate, by_demand):
        demand += "; more than the service could serve: requests queue on GPUs as busy as before"
    return Candidate(
        Cause.TRAFFIC_SURGE, f.service_subject(), weigh(strength, share), share,
        f"arrivals x{r:.1f} ({value(rps, 0):.1f} -> {value(rps):.1f} req/s) on "
        f"{f.service}{demand}; queue time {f.ms('queue'):+.0f} ms ({f.share('queue'):.0%} "
        f"of excess), {waiting:.0f} requests waiting",
        {"rps": rps, "rps_ratio": r, "waiting": waiting, "demand_strength": by_demand,
         "overload_strength": overload},
    )


def overload_strength(f: Facts) -> float:
    """An overload: arrivals up by a burst
    (:data:`~fleetlens.pipeline.schema.bursts.BURST_RATIO`; full 0.15 above
    :data:`SURGE_RAMP_FROM`) past what the service serves, so requests pile up in the
    queue (:data:`OVERLOAD_QUEUE` more waiting for full strength) while its GPUs draw as
    much power as before (:meth:`Facts.power_kept`: no GPU-side cause took capacity away).
    A service already near its knee slows down a lot on a modest burst: random fleet
    41006's clean control, a one-host TP-4 service whose natural x1.3-1.6 bursts queued
    26-286 requests and made each token x3-7 slower, scored x1.3-1.6 as a weak surge and
    was named ``collective_stall`` six times (its GPUs' memory idled as the batch grew)."""
    r = ratio(f.signals.scope.get("rps"))
    if r < BURST_RATIO:
        return 0.0
    more = clip01((r - SURGE_RAMP_FROM) / 0.15)
    waiting = sum(delta(f.signals.hosts.get(h, {}).get("waiting")) for h in f.hosts())
    return more * clip01(waiting / OVERLOAD_QUEUE) * f.power_kept()


def rate_led_demand(f: Facts) -> float:
    """A surge of demand the arrivals led: more requests *and* longer ones (random fleet
    28009's clean control: a replayed trace's burst of new conversations, arrivals x1.4
    with prompts x1.6, read as long prompts, x1.4 alone being a weak surge). It counts when
    the arrivals rose by a burst (:data:`~fleetlens.pipeline.schema.bursts.BURST_RATIO`, x1.3;
    fully 0.1 above it), the tokens asked for per second
    by x1.5 (fully at x1.9), and the arrivals carried at least :data:`SURGE_RATE_PART` of
    that growth: prompts x3 beside arrivals x1.3 are the prompts' doing. A replayed trace
    drifts x1.2-1.3 in arrivals with prompts x1.3-1.4 by itself (random fleet 27011):
    under a fault, that is no surge."""
    r, d = ratio(f.signals.scope.get("rps")), demand_ratio(f)
    if r <= 1 or d <= 1 or math.log(r) < SURGE_RATE_PART * math.log(d):
        return 0.0
    return clip01((d - 1.5) / 0.4) * clip01((r - BURST_RATIO) / 0.1)


def surge_strength(f: Facts) -> float:
    """How much the arrivals alone say surge: nothing below a burst
    (:data:`~fleetlens.pipeline.schema.bursts.BURST_RATIO`: the labeller's definition too;
    x1.25-1.3 counted a little before), a burst itself already a little (x1.3 at capacity
    is a surge, random fleet 29001), fully at :data:`SURGE_FULL_RATIO`."""
    r = ratio(f.signals.scope.get("rps"))
    if r < BURST_RATIO:
        return 0.0
    return clip01((r - SURGE_RAMP_FROM) / (SURGE_FULL_RATIO - SURGE_RAMP_FROM))


def long_prompt_strength(f: Facts) -> float:
    return clip01((ratio(f.signals.scope.get(c.INPUT_TOKENS)) - 1.3) / 1.2)


def demand_ratio(f: Facts) -> float:
    """Incident/baseline tokens asked for per second (arrivals x tokens per request); 1
    where a side is missing."""
    rps, tin, tout = (f.signals.scope.get(k) for k in ("rps", c.INPUT_TOKENS, c.OUTPUT_TOKENS))
    if not all(p and p[0] and p[1] for p in (rps, tin, tout)):
        return 1.0
    before = value(rps, 0) * (value(tin, 0) + value(tout, 0))
    after = value(rps) * (value(tin) + value(tout))
    return after / before if before > 0 else 1.0


def demand_strength(f: Facts) -> float:
    """More tokens asked for per second (arrivals x tokens per request): a full cache that
    came with ~1.5x the demand is the demand's doing, whichever of rate or length grew."""
    return clip01((demand_ratio(f) - 1.3) / 0.4)


def _load_share(f: Facts) -> float:
    """Share of the excess more prompt tokens explain: prefill (more tokens, and a prompt
    mix that costs more per token), the queue behind it and, as far as the GPUs got busier,
    the slower decode of everyone sharing them."""
    return min(1.0, f.share("prefill", "queue") + f.busier() * f.share("decode"))


def kv_strength(f: Facts, host: str) -> float:
    """KV pressure on ``host``: the cache filled up (and the usage rose: a cache that is
    always nearly full is no change), more so when preemptions went up."""
    s = f.signals.hosts.get(host, {})
    kv_term = (clip01((value(s.get("kv_max")) - 0.9) / 0.08)
               * clip01(delta(s.get("kv_max")) / 0.05))
    pre_term = clip01((delta(s.get("preempt_per_min")) - 0.5) / 5.0)
    return 0.35 * kv_term + 0.65 * pre_term if pre_term > 0 else 0.3 * kv_term


def kv_pressure(f: Facts) -> Candidate:
    per_host = {h: kv_strength(f, h) for h in f.all_hosts()}
    subject, strength = place(f, per_host)
    host = _focus(f, per_host)
    s = f.signals.hosts.get(host, {})
    # A full cache because of more or longer requests is the demand change's doing; one
    # that filled while *more* requests were running (each holding its blocks longer behind
    # a slower GPU, link or engine, or more of them let in) is the slowdown's or the load's.
    # A cache that shrank runs fewer, so 1.4x as many running rules the cache out as cause.
    crowded = clip01((f.running_ratio([host] if host else None) - 1.1) / 0.3)
    damp = min(1 - 0.6 * max(surge_strength(f), long_prompt_strength(f), demand_strength(f)),
               1 - CROWDED_DAMP * crowded)
    # Waiting for blocks (queue), smaller or preempted batches (decode) and recomputing
    # preempted prompts (prefill per token).
    share = f.share("queue", "decode", "prefill_rate")
    return Candidate(
        Cause.KV_CACHE_PRESSURE, subject, weigh(strength * damp, share), share,
        f"queue time {f.ms('queue'):+.0f} ms, decode {f.ms('decode'):+.0f} ms "
        f"({f.share('queue', 'decode'):.0%} of excess) on {_where(subject)}: KV cache "
        f"{value(s.get('kv_max')):.0%} full, {value(s.get('preempt_per_min')):.0f} "
        "preemptions/min",
        {"kv_max": s.get("kv_max"), "kv_mean": s.get("kv_mean"),
         "preempt_per_min": s.get("preempt_per_min"), "per_host_strength": per_host},
    )


def reuse_lost(reused: Pair | None) -> float:
    """How far the prompt tokens served from the prefix cache per second fell: 0 at x0.8
    or more, 1 at x0.5 or less (1 where not measured). A cache that stopped reusing (emptied,
    bypassed, a template change for most requests) serves fewer; a burst of new
    conversations brings new prefixes and lowers the hit *rate*, but the old ones are reused
    as before (random fleet 42000's clean control: a natural x1.3 burst took the hit rate
    45% -> 26% with hits per second x0.95, and was named prefix_cache_drop)."""
    if not reused or not reused[0] or reused[1] is None:
        return 1.0
    return clip01((0.8 - ratio(reused)) / 0.3)


def prefix_drop(f: Facts) -> Candidate:
    per_host = {}
    for h in f.all_hosts():
        s = f.signals.hosts.get(h, {})
        hit = s.get(c.PREFIX_HIT_RATE)
        base = value(hit, 0)
        per_host[h] = (clip01((base - value(hit) - 0.05) / 0.25)
                       * reuse_lost(s.get(PREFIX_HITS_PER_S)) if base >= 0.1 else 0.0)
    cached = f.signals.scope.get("cached_ratio")
    from_requests = (clip01((value(cached, 0) - value(cached) - 0.05) / 0.25)
                     * reuse_lost(f.signals.scope.get(CACHED_PER_S)))
    subject, strength = place(f, per_host)
    if from_requests > strength:
        strength = from_requests
    host = _focus(f, per_host)
    hit = f.signals.hosts.get(host, {}).get(c.PREFIX_HIT_RATE)
    # Lost reuse means more tokens to prefill, the longer prefills queue others, and where
    # the GPUs got busier with that work every token is slower.
    share = _load_share(f)
    # Prompts twice as long share the same prefix: the hit rate halves with the cache
    # working as before, and a cache full of longer requests evicts prefixes. With the
    # demand up that much, the lower reuse is its doing.
    damp = 1 - 0.6 * max(long_prompt_strength(f), demand_strength(f))
    return Candidate(
        Cause.PREFIX_CACHE_DROP, subject, weigh(strength * damp, share), share,
        f"prefill {f.ms('prefill'):+.0f} ms, queue {f.ms('queue'):+.0f} ms on "
        f"{_where(subject)}: prefix cache hit rate {value(hit, 0):.0%} -> {value(hit):.0%} "
        f"({share:.0%} of excess)",
        {c.PREFIX_HIT_RATE: hit, "cached_ratio": cached, "per_host_strength": per_host,
         PREFIX_HITS_PER_S: f.signals.hosts.get(host, {}).get(PREFIX_HITS_PER_S)},
    )


def long_prompts(f: Facts) -> Candidate:
    tokens = f.signals.scope.get(c.INPUT_TOKENS)
    r = ratio(tokens)
    strength = long_prompt_strength(f)
    share = _load_share(f)
    return Candidate(
        Cause.LONG_PROMPTS, f.service_subject(), weigh(strength, share), share,
        f"prompts {value(tokens, 0):.0f} -> {value(tokens):.0f} tokens (x{r:.1f}) on "
        f"{f.service}; prefill {f.ms('prefill'):+.0f} ms, queue {f.ms('queue'):+.0f} ms",
        {c.INPUT_TOKENS: tokens, "input_ratio": r},
    )
