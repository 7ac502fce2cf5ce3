"""Scoring rules for hardware and overhead causes: thermal throttle, power cap, slow GPU,
collective (tensor-parallel) stall, network and engine overhead."""

from __future__ import annotations

from analytics.attribution.rules import Candidate, Facts, clip01, gpu_place, place
from analytics.attribution.signals import delta, ratio, value
from pipeline.schema import Cause
from pipeline.schema import columns as c
from pipeline.schema.causes import subject as fmt_subject


def _where(subject: str) -> str:
    return subject.split("=", 1)[1]


def thermal_strength(f: Facts, gpu: str) -> float:
    s = f.signals.gpus.get(gpu, {})
    clock_drop = 1 - ratio(s.get("sm_clock"))
    return max(clip01(delta(s.get("thermal_frac")) / 0.5),
               clip01(clock_drop / 0.2) * clip01(delta(s.get("temp")) / 10))


def power_strength(f: Facts, gpu: str) -> float:
    s = f.signals.gpus.get(gpu, {})
    clock_drop = 1 - ratio(s.get("sm_clock"))
    at_limit = 1.0 if value(s.get("power_vs_limit")) >= 0.95 else 0.0
    return max(clip01(delta(s.get("power_cap_frac")) / 0.5),
               clip01((1 - ratio(s.get("power_limit"))) / 0.2),
               clip01(clock_drop / 0.2) * at_limit)


def _gpu_candidate(f: Facts, cause: str, strength_of, describe) -> Candidate:
    per_gpu = {g: strength_of(f, g) for g in f.gpus()}
    subject, strength, host = gpu_place(f, per_gpu)
    gpu = max(per_gpu, key=per_gpu.__getitem__) if per_gpu else ""
    s = f.signals.gpus.get(gpu, {})
    share = f.share("prefill", "decode", "queue")
    return Candidate(cause, subject, strength * (0.4 + 0.6 * share), share,
                     describe(f, subject, gpu, s, host),
                     {"gpu": gpu, "signals": s, "per_gpu_strength": per_gpu})


def thermal_throttle(f: Facts) -> Candidate:
    def describe(f, subject, gpu, s, host) -> str:
        return (f"SM clock {value(s.get('sm_clock'), 0):.0f} -> {value(s.get('sm_clock')):.0f}"
                f" MHz on {_where(subject)}: thermal throttling in "
                f"{value(s.get('thermal_frac')):.0%} of samples at {value(s.get('temp')):.0f} C;"
                f" decode +{f.ms('decode'):.0f} ms, prefill +{f.ms('prefill'):.0f} ms")
    return _gpu_candidate(f, Cause.THERMAL_THROTTLE, thermal_strength, describe)


def power_cap(f: Facts) -> Candidate:
    def describe(f, subject, gpu, s, host) -> str:
        return (f"power limit {value(s.get('power_limit'), 0):.0f} -> "
                f"{value(s.get('power_limit')):.0f} W on {_where(subject)}, power at "
                f"{value(s.get('power_vs_limit')):.0%} of limit, power-cap throttling in "
                f"{value(s.get('power_cap_frac')):.0%} of samples; SM clock "
                f"{value(s.get('sm_clock'), 0):.0f} -> {value(s.get('sm_clock')):.0f} MHz")
    return _gpu_candidate(f, Cause.POWER_CAP, power_strength, describe)


def _slowdown(s: dict) -> float:
    return max(ratio(s.get("tpot")), ratio(s.get("prefill_per_token")))


def slow_gpu_strength(f: Facts, gpu: str) -> float:
    s = f.signals.gpus.get(gpu, {})
    if "tpot" not in s:  # no per-GPU requests: judged at host level instead
        return 0.0
    hw = max(thermal_strength(f, gpu), power_strength(f, gpu))
    util_ok = clip01((ratio(s.get("util")) - 0.7) / 0.2)
    return clip01((_slowdown(s) - 1.2) / 0.6) * (1 - hw) * util_ok


def slow_gpu(f: Facts) -> Candidate:
    per_gpu = {g: slow_gpu_strength(f, g) for g in f.gpus()}
    if any(per_gpu.values()):
        subject, strength, _ = gpu_place(f, per_gpu)
        gpu = max(per_gpu, key=per_gpu.__getitem__)
        s = f.signals.gpus.get(gpu, {})
    else:  # no instance-to-GPU mapping: the host's requests and GPUs
        per_host = {}
        for h in f.hosts():
            gpus = [g for g, gh in f.signals.gpu_host.items() if gh == h]
            hw = max([max(_hw(f, g)) for g in gpus], default=0.0)
            util = [ratio(f.signals.gpus[g].get("util")) for g in gpus]
            util_ok = clip01((min(util, default=1.0) - 0.7) / 0.2)
            per_host[h] = clip01((_slowdown(f.signals.hosts.get(h, {})) - 1.2) / 0.6) * (
                1 - hw) * util_ok
        subject, strength = place(f, per_host)
        s = f.signals.hosts.get(max(per_host, key=per_host.__getitem__), {}) if per_host else {}
    kv = max((value(v.get("kv_max")) for v in f.signals.hosts.values()), default=0.0)
    damp = 1 - 0.5 * clip01((kv - 0.9) / 0.08)
    share = f.share("decode", "prefill")
    return Candidate(
        Cause.SLOW_GPU, subject, strength * damp * (0.4 + 0.6 * share), share,
        f"decode {value(s.get('tpot'), 0) * 1000:.1f} -> {value(s.get('tpot')) * 1000:.1f} "
        f"ms/token on {_where(subject)} with normal clocks and no throttling "
        f"({share:.0%} of excess)",
        {"signals": s, "per_gpu_strength": per_gpu},
    )


def _hw(f: Facts, gpu: str) -> tuple[float, float]:
    return thermal_strength(f, gpu), power_strength(f, gpu)


def _host_util(f: Facts, host: str) -> float:
    gpus = [g for g, h in f.signals.gpu_host.items() if h == host]
    utils = [ratio(f.signals.gpus[g].get("util")) for g in gpus]
    return sum(utils) / len(utils) if utils else 1.0


def collective_stall(f: Facts) -> Candidate:
    multi = {i for i, gpus in f.signals.instance_gpus.items() if len(gpus) > 1}
    per_host = {}
    for h in f.hosts():
        tp = any(f.signals.gpu_host.get(g) == h for i in multi
                 for g in f.signals.instance_gpus[i])
        gpus = [g for g, gh in f.signals.gpu_host.items() if gh == h]
        hw = max([max(_hw(f, g)) for g in gpus], default=0.0)
        idle = clip01((0.85 - _host_util(f, h)) / 0.25)
        slow = clip01((_slowdown(f.signals.hosts.get(h, {})) - 1.2) / 0.6)
        # Without a known multi-GPU instance on the host a stall is less likely.
        weight = 1.0 if tp else 0.5
        per_host[h] = slow * idle * (1 - hw) * weight
    subject, strength = place(f, per_host)
    host = max(per_host, key=per_host.__getitem__) if per_host else ""
    s = f.signals.hosts.get(host, {})
    share = f.share("decode", "prefill")
    return Candidate(
        Cause.COLLECTIVE_STALL, subject, strength * (0.4 + 0.6 * share), share,
        f"decode x{ratio(s.get('tpot')):.1f} on {_where(subject)} while its GPUs wait "
        f"(utilisation x{_host_util(f, host):.2f}, clocks normal): tensor-parallel stall",
        {"tpot": s.get("tpot"), "util_ratio": _host_util(f, host), "per_host_strength": per_host},
    )


def _overhead(f: Facts) -> tuple[float, float, dict[str, float]]:
    """Overhead strength, the network part of it (None-safe), and per-host network+engine
    overhead increase."""
    over = f.phases.excess_s.get("overhead", 0.0)
    strength = clip01(f.share("overhead") / 0.5) * clip01(over / 0.05)
    net = max(f.phases.excess_s.get("network", 0.0), 0.0)
    eng = max(f.phases.excess_s.get("engine_overhead", 0.0), 0.0)
    net_frac = net / (net + eng) if net + eng > 0 else 0.0
    per_host = {h: max(delta(f.signals.hosts.get(h, {}).get("overhead")), 0.0)
                + max(delta(f.signals.hosts.get(h, {}).get("network")), 0.0)
                for h in f.hosts()}
    return strength, net_frac, per_host


def _has_network(f: Facts) -> bool:
    return c.NETWORK_S in f.ctx.requests_inc.columns and bool(
        f.ctx.requests_inc[c.NETWORK_S].is_not_null().any())


def _engine_term(f: Facts, subject: str) -> float:
    hosts = [subject.split("=", 1)[1]] if subject.startswith(c.HOST_NAME) else f.hosts()
    util = min((_host_util(f, h) for h in hosts), default=1.0)
    return clip01((0.85 - util) / 0.25)


def network_overhead(f: Facts) -> Candidate:
    strength, net_frac, per_host = _overhead(f)
    subject, _ = place(f, per_host)
    # With gateway spans the network part is measured; without, busy GPUs point away from
    # the engine.
    part = net_frac if _has_network(f) else 1 - _engine_term(f, subject)
    return Candidate(
        Cause.NETWORK_OVERHEAD, subject, strength * part, f.share("overhead") * part,
        f"network +{f.ms('network'):.0f} ms, overhead +{f.ms('overhead'):.0f} ms "
        f"({f.share('overhead'):.0%} of excess) between gateway and engine on "
        f"{_where(subject)}; GPUs busy as usual",
        {"overhead_delta_s": per_host, "network_share_of_overhead": net_frac},
    )


def engine_overhead(f: Facts) -> Candidate:
    strength, net_frac, per_host = _overhead(f)
    subject, _ = place(f, per_host)
    part = (1 - net_frac) if _has_network(f) else _engine_term(f, subject)
    hosts = [subject.split("=", 1)[1]] if subject.startswith(c.HOST_NAME) else f.hosts()
    util = min((_host_util(f, h) for h in hosts), default=1.0)
    if subject.startswith(c.SERVICE_NAME) and len(hosts) == 1:
        subject = fmt_subject(c.HOST_NAME, hosts[0])
    return Candidate(
        Cause.ENGINE_OVERHEAD, subject, strength * part, f.share("overhead") * part,
        f"engine overhead +{f.ms('engine_overhead'):.0f} ms ({f.share('overhead'):.0%} of "
        f"excess) on {_where(subject)}: GPU utilisation x{util:.2f} while requests wait on "
        "the engine",
        {"overhead_delta_s": per_host, "util_ratio": util},
    )
