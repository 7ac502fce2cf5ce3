"""The scenario of ``bench/detect_delay.py``: a failure service and three latency services,
failures in 90 s slots and one latency incident per service per round (see its docstring)."""

from __future__ import annotations

from typing import Any

from bench.detect_delay_score import LATENCY_KINDS

WARMUP_S = 240
ROUND_S = 450
FAIL_SLOT_S = 90
TAIL_S = 100  # after the last incident ends: time for the last posts
LATENCY_SERVICES = ("lat-b", "lat-c", "lat-d")


def _incidents(repeat: int, limit_s: int | None) -> list[dict[str, Any]]:
    """The injected incidents of ``repeat`` rounds (those ending by ``limit_s`` - TAIL_S)."""
    out = []
    for r in range(repeat):
        base = WARMUP_S + r * ROUND_S
        fail_hosts = [f"a{1 + (r + k) % 3:02d}" for k in range(3)]
        failures = [
            {"kind": "engine_down", "gpu": f"{fail_hosts[0]}:0", "duration_s": 60},
            {"kind": "engine_hang", "gpu": f"{fail_hosts[1]}:1", "duration_s": 60},
            {"kind": "request_errors", "host": fail_hosts[2], "duration_s": 60,
             "magnitude": 0.3},
            {"kind": "host_down", "host": fail_hosts[0], "duration_s": 80},
            {"kind": "telemetry_gap", "host": fail_hosts[1], "duration_s": 80},
        ]
        for i, inc in enumerate(failures):
            out.append({**inc, "start_s": base + i * FAIL_SLOT_S})
        for j, service in enumerate(LATENCY_SERVICES):
            kind = LATENCY_KINDS[(r + j) % len(LATENCY_KINDS)]
            host = f"{service[-1]}01"
            inc: dict[str, Any] = {"kind": kind, "duration_s": 60,
                                   "start_s": base + 30 + j * 150}
            if kind == "traffic_surge":
                inc.update(service=service, magnitude=3.0)
            elif kind == "kv_cache_pressure":
                inc.update(host=host, magnitude=0.9)
            else:
                inc.update(host=host, magnitude=0.03)
            out.append(inc)
    if limit_s is not None:
        out = [i for i in out if i["start_s"] + i["duration_s"] + TAIL_S <= limit_s]
    return sorted(out, key=lambda i: i["start_s"])


def scenario_doc(repeat: int, limit_s: int | None, seed: int) -> dict[str, Any]:
    """The bench fleet and its incidents (see the module docstring)."""
    incidents = _incidents(repeat, limit_s)
    end = max((i["start_s"] + i["duration_s"] for i in incidents), default=WARMUP_S)
    duration = end + TAIL_S if limit_s is None else min(end + TAIL_S, limit_s)
    hosts = [{"prefix": "a", "count": 3, "gpus": 2, "gpu": "H100-SXM", "region": "r1"}]
    deployments = [{"service": "fail", "model": "llama-3.1-8b", "hosts": ["a*"], "tp": 1}]
    workloads = [{"service": "fail", "rate": 12.0, "gateway_share": 1.0,
                  "bursts_per_hour": 0,
                  "prompt": {"dist": "lognormal", "median": 700, "sigma": 0.8, "min": 16,
                             "max": 6000},
                  "output": {"dist": "lognormal", "median": 160, "sigma": 0.6, "min": 4,
                             "max": 1000}}]
    for service in LATENCY_SERVICES:
        letter = service[-1]
        hosts.append({"prefix": letter, "count": 2, "gpus": 2, "gpu": "L4", "region": "r1"})
        deployments.append({"service": service, "model": "llama-3.1-8b",
                            "hosts": [f"{letter}*"], "tp": 1})
        workloads.append({"service": service, "rate": 5.0, "gateway_share": 0.5,
                          "bursts_per_hour": 0, "prefix_groups": 4, "prefix_tokens": 256,
                          "prefix_share": 0.5,
                          "prompt": {"dist": "lognormal", "median": 500, "sigma": 0.7,
                                     "min": 16, "max": 4000},
                          "output": {"dist": "lognormal", "median": 120, "sigma": 0.6,
                                     "min": 4, "max": 800}})
    return {"fleet": {"name": "detect-delay", "duration_s": duration, "drain_s": 0,
                      "sample_interval_s": 1, "tick_s": 1.0, "seed": seed, "hosts": hosts},
            "deployment": deployments, "workload": workloads, "incident": incidents}
