"""Scoring rules for hardware and overhead causes: slow GPU, collective (tensor-parallel)
stall, network and engine overhead (the throttles are in :mod:`rules_throttle`).

A slow GPU is a straggler: slower than its peers serving the same model in the same period
(its host against the other hosts, its instance against the other instances), at a normal
clock, and never when its decode got faster.
"""

from __future__ import annotations

import statistics

from fleetlens.analytics.attribution.logs import collective_log_strength
from fleetlens.analytics.attribution.rules import (
    Candidate,
    Facts,
    clip01,
    gpu_place,
    kv_strength,
    overload_strength,
    place,
    weigh,
)
from fleetlens.analytics.attribution.rules_throttle import (
    PEER_DAMP,
    measured,
    power_strength,
    shared_by_peers,
    slowdown,
    thermal_strength,
    where,
)
from fleetlens.analytics.attribution.signals import delta, ratio, value
from fleetlens.pipeline.schema import Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject as fmt_subject

#: How much of a stall signature seen on every host under more arrivals is discounted.
STALL_LOAD_DAMP = 0.8


def _hw(f: Facts, gpu: str) -> float:
    """Evidence that ``gpu`` is throttled, or at least not at its usual clock: a slow GPU
    and a collective stall are slow *at normal clocks* (a clock down 10% or more, whatever
    the reason bits say, is no normal clock)."""
    clock_drop = 1 - ratio(f.signals.gpus.get(gpu, {}).get("sm_clock"))
    return max(thermal_strength(f, gpu), power_strength(f, gpu),
               clip01((clock_drop - 0.03) / 0.07))


def _host_gpus(f: Facts, host: str) -> list[str]:
    return sorted(g for g, h in f.signals.gpu_host.items() if h == host)


def _mean_ratio(f: Facts, gpus: list[str], key: str) -> float:
    values = [ratio(f.signals.gpus[g].get(key)) for g in gpus if g in f.signals.gpus]
    return sum(values) / len(values) if values else 1.0


def _groups(f: Facts, host: str) -> list[list[str]]:
    """The host's multi-GPU (tensor-parallel) instances as GPU lists."""
    return [gpus for gpus in f.signals.instance_gpus.values()
            if len(gpus) > 1 and all(f.signals.gpu_host.get(g) == host for g in gpus)]


def _host_slow(f: Facts, host: str) -> float:
    return clip01((slowdown(f.signals.hosts.get(host, {})) - 1.2) / 0.6)


def _vs_peers(own: float, peers: list[float]) -> float:
    """A slowdown relative to the median slowdown of the peers (itself without peers): a
    straggler is slower than its siblings now, whatever the traffic does to all of them."""
    return own / statistics.median(peers) if peers else own


def _straggler_host(f: Facts, host: str, need_peers: bool = False) -> float:
    """``host`` slower per token than the other hosts serving the same model (than its
    own baseline where it has no peers, unless ``need_peers``)."""
    own = f.signals.hosts.get(host, {})
    if "tpot" not in own:
        return 0.0
    peers = [slowdown(v) for h, v in f.signals.hosts.items() if h != host and "tpot" in v]
    if need_peers and not peers:
        return 0.0
    return clip01((_vs_peers(slowdown(own), peers) - 1.2) / 0.6)


def _unmeasured_host(f: Facts, host: str) -> float:
    """A host without GPU telemetry (no agent, or a CPU server): that its GPUs are busy at
    normal clocks is not measured, so only a straggler against its peers counts, at half
    strength. A lone instance slower than its own past is what every cause looks like: a
    real vLLM server whose shrunken KV cache preempted and recomputed (decode per token
    6.4 -> 13.0 ms) scored slow_gpu 0.50 "with normal clocks", over the KV pressure."""
    return 0.5 * _straggler_host(f, host, need_peers=True)


def _straggler_instance(f: Facts, group: list[str]) -> float:
    """The tensor-parallel instance running on ``group`` slower per token than the other
    instances of the incident's requests: on a host that also runs healthy instances of
    the same service, the host's own figures dilute a straggling group."""
    inst = next((i for i, gpus in f.signals.instance_gpus.items() if gpus == group), None)
    own = f.signals.instances.get(inst or "", {})
    if "tpot" not in own:
        return 0.0
    peers = [slowdown(v) for i, v in f.signals.instances.items() if i != inst and "tpot" in v]
    return clip01((_vs_peers(slowdown(own), peers) - 1.2) / 0.6)


def slow_gpu_strength(f: Facts, gpu: str) -> float | None:
    """A GPU slower at a normal clock than its peers. Alone (TP1) its requests decode
    slower than its sibling GPUs' while it stays busy; in a tensor-parallel group it keeps
    its memory busy while its peers wait on it (and its host is slower than the others).
    ``None`` when the GPU cannot be judged on its own (no per-GPU requests, or a group
    without memory activity figures): the host is judged instead."""
    s = f.signals.gpus.get(gpu, {})
    hw = _hw(f, gpu)
    host = f.signals.gpu_host.get(gpu, "")
    for group in _groups(f, host):
        if gpu in group:
            if not all(measured(f.signals.gpus.get(g, {}).get(c.UTIL_MEM)) for g in group):
                return None
            peers = [g for g in group if g != gpu]
            gap = ratio(s.get(c.UTIL_MEM)) - min(
                ratio(f.signals.gpus.get(g, {}).get(c.UTIL_MEM)) for g in peers)
            slower = max(_straggler_host(f, host), _straggler_instance(f, group))
            return slower * clip01((gap - 0.1) / 0.3) * (1 - hw)
    if "tpot" not in s:
        return None
    busy = clip01((ratio(s.get("util")) - 0.85) / 0.15)
    peers = [slowdown(v) for g, v in f.signals.gpus.items() if g != gpu and "tpot" in v]
    slower = _vs_peers(slowdown(s), peers)
    return clip01((slower - 1.2) / 0.6) * (1 - hw) * busy


def _group_straggler(f: Facts, host: str) -> float:
    """A tensor-parallel host slower per token than its peer hosts while none of its GPUs
    stands out (the group runs at its slowest GPU's pace; which one cannot be told): not
    when its GPUs idle (the engine is late), wait with memory idle (the link: a collective
    stall) or are throttled. Half strength: the evidence names the host, not the GPU."""
    if not _groups(f, host):
        return 0.0
    gpus = _host_gpus(f, host)
    hw = max([_hw(f, g) for g in gpus], default=0.0)
    idle = clip01((0.85 - _mean_ratio(f, gpus, "util")) / 0.25)
    mem = [ratio(f.signals.gpus[g].get(c.UTIL_MEM)) for g in gpus
           if measured(f.signals.gpus.get(g, {}).get(c.UTIL_MEM))]
    waiting = clip01((0.85 - max(mem)) / 0.25) if mem else 0.0
    return 0.5 * _straggler_host(f, host) * (1 - hw) * (1 - idle) * (1 - waiting)


def _decode_faster(f: Facts) -> dict | None:
    """The scope's decode time per token when it went down (a slow GPU is ruled out)."""
    pairs = [f.signals.hosts.get(h, {}).get("tpot") for h in f.hosts()]
    pairs = [p for p in pairs if p and p[0] is not None and p[1] is not None]
    if not pairs:
        return None
    base, inc = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    if base <= 0 or inc >= base:
        return None
    return {"ruled_out": f"decode {base / len(pairs) * 1000:.1f} -> "
                         f"{inc / len(pairs) * 1000:.1f} ms/token: faster, not slower"}


def slow_gpu(f: Facts) -> Candidate:
    judged = {g: slow_gpu_strength(f, g) for g in f.gpus()}
    per_gpu = {g: v for g, v in judged.items() if v is not None}
    if any(per_gpu.values()):
        subject, strength, _ = gpu_place(f, per_gpu)
        gpu = max(per_gpu, key=per_gpu.__getitem__)
        s = f.signals.gpus.get(gpu, {})
        if "tpot" not in s:
            s = {**s, **f.signals.hosts.get(f.signals.gpu_host.get(gpu, ""), {})}
    else:  # no GPU stands out: the host against its peers, busy GPUs, normal clocks
        per_host = {}
        for h in f.hosts():
            gpus = _host_gpus(f, h)
            if not gpus:
                per_host[h] = 0.0 if per_gpu else _unmeasured_host(f, h)
                continue
            hw = max([_hw(f, g) for g in gpus], default=0.0)
            busy = clip01((_mean_ratio(f, gpus, "util") - 0.85) / 0.15)
            alone = 0.0 if per_gpu else _straggler_host(f, h) * (1 - hw) * busy
            per_host[h] = max(alone, _group_straggler(f, h))
        subject, strength = place(f, per_host)
        s = f.signals.hosts.get(max(per_host, key=per_host.__getitem__), {}) if per_host else {}
    kv = max((value(v.get("kv_max")) for v in f.signals.hosts.values()), default=0.0)
    damp = 1 - 0.5 * clip01((kv - 0.9) / 0.08)
    share = f.share("decode", "prefill_rate")
    faster = _decode_faster(f) if f.ctx.host else None
    return Candidate(
        Cause.SLOW_GPU, subject, 0.0 if faster else weigh(strength * damp, share), share,
        f"decode {value(s.get('tpot'), 0) * 1000:.1f} -> {value(s.get('tpot')) * 1000:.1f} "
        f"ms/token on {where(subject)} "
        f"{'with normal clocks and no throttling' if f.gpus() else 'against its peers'} "
        f"({share:.0%} of excess)",
        {"signals": s, "per_gpu_strength": per_gpu, **(faster or {})},
    )


def _host_util(f: Facts, host: str) -> float:
    return _mean_ratio(f, _host_gpus(f, host), "util")


def _stall_strength(f: Facts, h: str, detail: dict) -> float:
    """The stall signature on host ``h``: a TP group busy with its memory idle, decode
    slower, no throttle; or the engines' NCCL warnings and watchdog timeouts."""
    best = 0.0
    shared = shared_by_peers(f, h)
    for group in _groups(f, h):
        mem = [ratio(f.signals.gpus.get(g, {}).get(c.UTIL_MEM)) for g in group]
        waiting = clip01((0.85 - max(mem)) / 0.25)  # all GPUs wait: it is the link
        busy = clip01((_mean_ratio(f, group, "util") - 0.85) / 0.1)
        hw = max(_hw(f, g) for g in group)
        best = max(best, _host_slow(f, h) * waiting * busy * (1 - hw)
                   * (1 - PEER_DAMP * shared))
        detail[h] = {"util_mem_ratio": mem, "util_ratio": _mean_ratio(f, group, "util"),
                     "shared_by_peers": shared}
    # --- issue 15 hook (analytics/attribution/logs.py): NCCL warnings and watchdog
    # collective timeouts from the host's engines are direct evidence of the stall.
    log, log_counts = collective_log_strength(f.ctx, h)
    if log_counts:
        detail.setdefault(h, {})["logs"] = log_counts
    return max(best, log * max(_host_slow(f, h), 0.5))


def _stalled_everywhere(f: Facts, per_host: dict[str, float]) -> float:
    """How far the signature is the load's: more work (arrivals or prompt tokens per
    request up, full from x1.5) while every other host of the scope shows it too. A link
    fails on one tensor-parallel group; a busier service makes every group's batches
    bigger, and longer prompts every step's prefill share bigger: each step is longer and
    the memory less busy per token, on every host at once (random fleet 7008's natural
    bursts; 14011's prompts x3-4 read as a stall on all five hosts)."""
    if len(per_host) < 2:
        return 0.0
    ranked = sorted(per_host.values(), reverse=True)
    others = sum(clip01(x / 0.3) for x in ranked[1:]) / (len(ranked) - 1)
    more = max(clip01((ratio(f.signals.scope.get(k)) - 1.2) / 0.3)
               for k in ("rps", c.INPUT_TOKENS))
    return more * others


def collective_stall(f: Facts) -> Candidate:
    """Tensor-parallel all-reduces slower: every GPU of the group waits (busy, but its
    memory idle and its power down), decode slows, clocks are normal."""
    detail: dict = {}
    every = {h: _stall_strength(f, h, detail) for h in f.all_hosts()}
    per_host = {h: every[h] for h in f.hosts()}
    # An overload also idles the memory of a growing batch, on a one-host service too,
    # where no peer tells the load's signature from the link's.
    damp = 1 - STALL_LOAD_DAMP * max(_stalled_everywhere(f, every), overload_strength(f))
    subject, strength = place(f, per_host)
    host = max(per_host, key=per_host.__getitem__) if per_host else ""
    s = f.signals.hosts.get(host, {})
    share = f.share("decode", "prefill_rate")
    mem = _mean_ratio(f, _host_gpus(f, host), c.UTIL_MEM)
    return Candidate(
        Cause.COLLECTIVE_STALL, subject, weigh(strength * damp, share), share,
        f"decode x{ratio(s.get('tpot')):.1f} on {where(subject)} while its tensor-parallel "
        f"GPUs wait on each other (memory activity x{mem:.2f}, utilisation "
        f"x{_host_util(f, host):.2f}, clocks normal)",
        {"tpot": s.get("tpot"), "groups": detail, "per_host_strength": per_host,
         "load_damp": damp},
    )


def _overhead(f: Facts) -> tuple[float, float, dict[str, float]]:
    """Overhead strength, the network part of it (None-safe), and per-host network+engine
    overhead increase. The strength (which also needs half the excess in the overhead)
    only chooses between the two overhead readings; the score is :func:`_overhead_score`."""
    over = f.phases.excess_s.get("overhead", 0.0)
    strength = clip01(f.share("overhead") / 0.5) * clip01(over / 0.05)
    net = max(f.phases.excess_s.get("network", 0.0), 0.0)
    eng = max(f.phases.excess_s.get("engine_overhead", 0.0), 0.0)
    net_frac = net / (net + eng) if net + eng > 0 else 0.0
    per_host = {h: max(delta(f.signals.hosts.get(h, {}).get("overhead")), 0.0)
                + max(delta(f.signals.hosts.get(h, {}).get("network")), 0.0)
                for h in f.all_hosts()}
    return strength, net_frac, per_host


def _overhead_score(f: Facts, part: float) -> tuple[float, float]:
    """(score, share of excess) of the part ``part`` of the overhead excess, on the one
    scale of every rule (:func:`weigh`): evidence that the overhead rose (full from +50 ms
    per request and 10% of the excess: a few ms more beside seconds of queueing is no
    evidence) times how surely this part is the cause's, weighed by the share of the excess
    it is. It used to be strength x part with the strength full at half the excess in the
    overhead: a network overhead explaining 95% of an incident scored 1.00, as much as a
    cause explaining all of another's."""
    over = f.phases.excess_s.get("overhead", 0.0)
    evidence = clip01(over / 0.05) * clip01(f.share("overhead") / 0.1) * part
    share = f.share("overhead") * part
    return weigh(evidence, share), share


def _has_network(f: Facts) -> bool:
    return c.NETWORK_S in f.ctx.requests_inc.columns and bool(
        f.ctx.requests_inc[c.NETWORK_S].is_not_null().any())


def _engine_term(f: Facts, subject: str) -> float:
    hosts = [subject.split("=", 1)[1]] if subject.startswith(c.HOST_NAME) else f.hosts()
    util = min((_host_util(f, h) for h in hosts), default=1.0)
    return clip01((0.85 - util) / 0.25)


def network_overhead(f: Facts) -> Candidate:
    _, net_frac, per_host = _overhead(f)
    subject, _ = place(f, per_host)
    # With gateway spans the network part is measured; without, busy GPUs point away from
    # the engine.
    part = net_frac if _has_network(f) else 1 - _engine_term(f, subject)
    score, share = _overhead_score(f, part)
    return Candidate(
        Cause.NETWORK_OVERHEAD, subject, score, share,
        f"network {f.ms('network'):+.0f} ms, overhead {f.ms('overhead'):+.0f} ms "
        f"({f.share('overhead'):.0%} of excess) between gateway and engine on "
        f"{where(subject)}; GPUs busy as usual",
        {"overhead_delta_s": per_host, "network_share_of_overhead": net_frac},
    )


def _idle_slow(f: Facts, host: str) -> float:
    """Decode slower while the host's GPUs idle at normal clocks: the engine (CPU) is late.
    Only with the running batch kept: a batch shrunk by a full KV cache (or preempted)
    also idles the GPUs and slows tokens, and that is KV pressure's evidence, not this."""
    gpus = _host_gpus(f, host)
    hw = max([_hw(f, g) for g in gpus], default=0.0)
    batch_kept = clip01((f.running_ratio([host]) - 0.5) / 0.3)
    return (_host_slow(f, host) * clip01((0.85 - _host_util(f, host)) / 0.25) * (1 - hw)
            * batch_kept * (1 - kv_strength(f, host)))


def engine_overhead(f: Facts) -> Candidate:
    strength, net_frac, per_host = _overhead(f)
    idle = {h: _idle_slow(f, h) for h in f.all_hosts()}
    if max(idle.values(), default=0.0) > strength * (1 - net_frac):
        subject, top = place(f, idle)
        util = min((_host_util(f, h) for h in idle if idle[h] >= 0.5 * top), default=1.0)
        share = f.share("decode", "prefill_rate", "overhead")
        return Candidate(
            Cause.ENGINE_OVERHEAD, subject, weigh(top, share), share,
            f"decode {f.ms('decode'):+.0f} ms, overhead {f.ms('overhead'):+.0f} ms on "
            f"{where(subject)} while its GPUs idle (utilisation x{util:.2f}, clocks "
            "normal): the engine spends longer per step outside the GPU",
            {"per_host_strength": idle, "util_ratio": util},
        )
    subject, _ = place(f, per_host)
    part = (1 - net_frac) if _has_network(f) else _engine_term(f, subject)
    hosts = [subject.split("=", 1)[1]] if subject.startswith(c.HOST_NAME) else f.hosts()
    util = min((_host_util(f, h) for h in hosts), default=1.0)
    if subject.startswith(c.SERVICE_NAME) and len(hosts) == 1:
        subject = fmt_subject(c.HOST_NAME, hosts[0])
    score, share = _overhead_score(f, part)
    return Candidate(
        Cause.ENGINE_OVERHEAD, subject, score, share,
        f"engine overhead {f.ms('engine_overhead'):+.0f} ms ({f.share('overhead'):.0%} of "
        f"excess) on {where(subject)}: GPU utilisation x{util:.2f} while requests wait on "
        "the engine",
        {"overhead_delta_s": per_host, "util_ratio": util},
    )
