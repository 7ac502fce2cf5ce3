"""Random fleets with random incidents, for an accuracy suite nobody can tune to.

:func:`random_fleet` turns a seed into a scenario document (the dict :func:`parse_scenario`
takes): host groups of 2, 4 or 8 GPUs of any GPU preset, services of any model preset at a
tensor-parallel size that fits (sometimes two services sharing hosts), Poisson rates sized to
the hardware with daily cycles and bursts, sometimes a replay of the shared Azure trace, and
incidents of every cause with random magnitudes, targets and 3-15 minute durations, some
overlapping in time on targets that share no engine. Everything is drawn from one
``random.Random(seed)``: the same seed gives the same document.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetlens.pipeline.schema import CAUSES
from fleetlens.simulator.specs import BLOCK_TOKENS, GPU_PRESETS, MODEL_PRESETS

#: the shared Azure trace (one hour of a code assistant's requests), replayed when present
AZURE_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "azure_llm_2023" / \
    "AzureLLMInferenceTrace_code.csv"
WARMUP_S = 1800.0  # baselines judge a series after 20 one-minute windows
#: quiet time after an incident before the next one starts (queues drain, the band settles)
GAP_S = 600.0
#: (low, high) of the random magnitude per cause; see DEFAULT_MAGNITUDE for the meaning
MAGNITUDES: dict[str, tuple[float, float]] = {
    "traffic_surge": (2.0, 4.0),
    "kv_cache_pressure": (0.85, 0.98),
    "prefix_cache_drop": (0.6, 1.0),
    "long_prompts": (2.5, 6.0),
    "thermal_throttle": (30.0, 50.0),
    "power_cap": (0.3, 0.55),
    "slow_gpu": (0.3, 0.6),
    "network_overhead": (0.1, 0.5),
    "collective_stall": (8.0, 40.0),
    "engine_overhead": (0.015, 0.06),
    # failures and changes: only request_errors reads its magnitude (the share that fails)
    "engine_down": (1.0, 1.0), "engine_hang": (1.0, 1.0), "host_down": (1.0, 1.0),
    "telemetry_gap": (1.0, 1.0), "gpu_fault": (1.0, 1.0), "config_change": (1.0, 1.0),
    "request_errors": (0.1, 0.5),
}
#: The causes a random fleet draws: every one the simulator injects (engine_restart comes
#: with the incidents that restart an engine).
DRAWN = tuple(x for x in CAUSES if x != "engine_restart")
#: What a random config_change sets: a bad deploy that slows the engine, or a version bump.
_CHANGES = ({"max_num_seqs": (2, 8)}, {"step_overhead_ms": (20, 60)}, {"version": "0.11.1"})
#: KV blocks an instance must hold at least (two full 16k-token prompts)
MIN_KV_BLOCKS = 2048
ACTIVATION_RESERVE = 2.0e9  # as simulator.fleet


@dataclass(frozen=True)
class FleetSize:
    """How big a random fleet may get."""

    hosts: tuple[int, int]  # (min, max) hosts
    incidents: tuple[int, int]  # (min, max) incidents
    max_rate: float  # total requests per second over the fleet (bounds the cost)


SMALL = FleetSize(hosts=(2, 3), incidents=(3, 4), max_rate=6.0)
FULL = FleetSize(hosts=(3, 5), incidents=(11, 13), max_rate=14.0)


def _kv_blocks(model: Any, gpu: Any, tp: int) -> int:
    free = (gpu.memory_gb * 1e9 * 0.9 - ACTIVATION_RESERVE) * tp - model.weight_bytes
    return int(free // (model.kv_bytes_per_token * BLOCK_TOKENS))


def _pick_service(rng: random.Random, gpu_name: str, gpus: int) -> tuple[str, int] | None:
    """A model preset and a TP size (1/2/4/8, at most ``gpus``) it fits at."""
    gpu = GPU_PRESETS[gpu_name]
    models = list(MODEL_PRESETS)
    rng.shuffle(models)
    for name in models:
        fits = [tp for tp in (1, 2, 4, 8) if tp <= gpus
                and _kv_blocks(MODEL_PRESETS[name], gpu, tp) >= MIN_KV_BLOCKS]
        if fits:
            # favour tensor parallelism: collective stalls need it, and real fleets use it
            return name, rng.choice(fits + [t for t in fits if t > 1])
    return None


def _instance_rate(rng: random.Random, model: str, gpu_name: str, tp: int) -> float:
    """Requests/s one instance serves at a random 15-40% of its batch-32 decode capacity."""
    m, g = MODEL_PRESETS[model], GPU_PRESETS[gpu_name]
    step_s = m.weight_bytes / (tp * g.hbm_gbps * 1e9 * 0.75) + 0.004
    return rng.uniform(0.15, 0.4) * 32 / (step_s * 200)


def _hosts_and_services(rng: random.Random, size: FleetSize) -> tuple[list, list, list]:
    """Host groups and deployments; returns (hosts tables, deployments, per-service facts)."""
    count = rng.randint(*size.hosts)
    groups = [count] if count < 3 or rng.random() < 0.5 else [count // 2, count - count // 2]
    hosts, deployments, services = [], [], []
    first = 1
    for gi, n in enumerate(groups):
        gpu_name = rng.choice(sorted(GPU_PRESETS))
        gpus = rng.choice((2, 4, 8))
        names = [f"h{i:02d}" for i in range(first, first + n)]
        hosts.append({"prefix": "h", "first": first, "count": n, "gpus": gpus, "gpu": gpu_name,
                      "region": rng.choice(("us-east-1", "eu-west-1"))})
        first += n
        shared = gpus >= 4 and rng.random() < 0.5  # two services on the same hosts
        per_service = [gpus // 2, gpus // 2] if shared else [gpus]
        for si, budget in enumerate(per_service):
            pick = _pick_service(rng, gpu_name, budget)
            if pick is None:
                continue
            model, tp = pick
            service = f"svc{gi + 1}{'ab'[si]}"
            deployments.append({"service": service, "model": model, "hosts": names, "tp": tp,
                                "instances_per_host": budget // tp})
            services.append({"service": service, "model": model, "tp": tp, "hosts": names,
                             "gpu": gpu_name, "instances": n * (budget // tp),
                             "gpu_offset": 0 if si == 0 else gpus // 2})
    return hosts, deployments, services


def _workloads(rng: random.Random, services: list[dict], size: FleetSize,
               duration_s: float) -> list[dict]:
    rates = [s["instances"] * _instance_rate(rng, s["model"], s["gpu"], s["tp"])
             for s in services]
    scale = min(1.0, size.max_rate / sum(rates))
    out = []
    for s, rate in zip(services, rates, strict=True):
        bursts = rng.random() < 0.5
        w = {"service": s["service"], "rate": round(max(rate * scale, 0.5), 3),
             "gateway_share": round(rng.uniform(0.3, 0.8), 2),
             "daily_amplitude": round(rng.uniform(0.0, 0.4), 2),
             "peak_hour": round(rng.uniform(0, 24), 1),
             "prefix_groups": rng.randint(2, 6), "prefix_tokens": rng.choice((256, 512, 1024)),
             "prefix_share": round(rng.uniform(0.4, 0.8), 2),
             "prompt": {"median": rng.randint(300, 1500), "sigma": 0.6, "max": 8000},
             "output": {"median": rng.randint(100, 300), "sigma": 0.6, "max": 1500}}
        if bursts:
            w.update(bursts_per_hour=rng.randint(1, 6),
                     burst_factor=round(rng.uniform(1.2, 1.6), 2),
                     burst_duration_s=rng.randint(10, 40))
        out.append(w)
        if AZURE_TRACE.is_file() and rng.random() < 0.3:
            # the real arrivals and lengths, stretched over the whole run
            out.append({"service": s["service"], "replay": str(AZURE_TRACE), "format": "azure",
                        "time_scale": round(duration_s / 3600.0, 3),
                        "gateway_share": w["gateway_share"]})
    return out


def _target(rng: random.Random, cause: str, services: list[dict], busy: set[str]
            ) -> tuple[dict, set[str]] | None:
    """A random valid target for ``cause`` among engines not in ``busy``; returns the
    incident's target keys and the engine groups (service, host, GPU block) it touches."""
    if cause in ("request_errors", "config_change") and rng.random() < 0.5:
        cause = "traffic_surge"  # the whole service, as a surge's target
    if cause in ("traffic_surge", "long_prompts"):
        choices = [s for s in services if not any(k.startswith(s["service"] + "/")
                                                  for k in busy)]
        if not choices:
            return None
        s = rng.choice(choices)
        return {"service": s["service"]}, {f"{s['service']}/{h}" for h in s["hosts"]}
    pool = [s for s in services if cause != "collective_stall" or s["tp"] > 1]
    pairs = [(s, h) for s in pool for h in s["hosts"] if f"{s['service']}/{h}" not in busy]
    if not pairs:
        return None
    s, host = rng.choice(pairs)
    # a host-level fault on a shared host touches both services' engines there
    touched = {f"{o['service']}/{host}" for o in services if host in o["hosts"]}
    if touched & busy:
        return None
    if cause in ("thermal_throttle", "power_cap", "slow_gpu", "gpu_fault"):
        gpu = s["gpu_offset"] + rng.randrange(s["instances"] // len(s["hosts"]) * s["tp"])
        return {"gpu": f"{host}:{gpu}"}, {f"{s['service']}/{host}"}
    if cause in ("engine_down", "engine_hang", "request_errors", "config_change"):
        return {"host": host, "service": s["service"]}, {f"{s['service']}/{host}"}
    return {"host": host}, touched


def _change(rng: random.Random) -> dict:
    """A random ``set`` of a config_change."""
    pick = dict(rng.choice(_CHANGES))
    return {k: (rng.randint(*v) if isinstance(v, tuple) else v) for k, v in pick.items()}


def _incidents(rng: random.Random, services: list[dict], size: FleetSize,
               causes: list[str]) -> tuple[list[dict], float]:
    """Incidents one after another (sometimes two at once); returns them and the run's end."""
    out: list[dict] = []
    t = WARMUP_S
    queue = list(causes)
    while queue:
        cause = queue.pop(0)
        picked = _target(rng, cause, services, set())
        if picked is None:
            continue  # e.g. no TP > 1 engine for a collective stall
        target, touched = picked
        duration = float(rng.randint(180, 900))
        out.append({"kind": cause, "start_s": t, "duration_s": duration,
                    "magnitude": round(rng.uniform(*MAGNITUDES[cause]), 3), **target,
                    **({"set": _change(rng)} if cause == "config_change" else {})})
        end = t + duration
        if queue and rng.random() < 0.35:  # a second one overlapping, on other engines
            second = _target(rng, queue[0], services, touched)
            if second is not None:
                cause2 = queue.pop(0)
                start2 = t + rng.uniform(0, duration * 0.8)
                d2 = float(rng.randint(180, 900))
                out.append({"kind": cause2, "start_s": round(start2), "duration_s": d2,
                            "magnitude": round(rng.uniform(*MAGNITUDES[cause2]), 3),
                            **second[0],
                            **({"set": _change(rng)} if cause2 == "config_change" else {})})
                end = max(end, round(start2) + d2)
        t = end + GAP_S
    return out, t


def random_fleet(seed: int, size: FleetSize = FULL) -> dict[str, Any]:
    """A random scenario document (see the module docstring) for ``seed``."""
    rng = random.Random(f"fleetlens-random-fleet:{seed}")
    hosts, deployments, services = _hosts_and_services(rng, size)
    n = rng.randint(*size.incidents)
    # every cause once before any repeats, in random order
    causes: list[str] = []
    while len(causes) < n:
        batch = list(DRAWN)
        rng.shuffle(batch)
        causes += batch
    incidents, end = _incidents(rng, services, size, causes[:n])
    duration = end
    start_hour = rng.randint(0, 23)
    return {
        "fleet": {"name": f"random{seed}", "start": f"2026-01-05T{start_hour:02d}:00:00Z",
                  "duration_s": duration, "drain_s": 60, "seed": seed, "hosts": hosts},
        "deployment": deployments,
        "workload": _workloads(rng, services, size, duration),
        "incident": incidents,
    }
