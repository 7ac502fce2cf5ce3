"""The root-cause vocabulary of the ``causes`` table (DESIGN.md section 3).

Extend it, never rename: stored incidents, the simulator's ground truth and outside checks
compare these strings.
"""

from __future__ import annotations

from enum import StrEnum


class Cause(StrEnum):
    """Why a latency spike happened, or what failed or changed."""

    TRAFFIC_SURGE = "traffic_surge"
    KV_CACHE_PRESSURE = "kv_cache_pressure"
    PREFIX_CACHE_DROP = "prefix_cache_drop"
    LONG_PROMPTS = "long_prompts"
    THERMAL_THROTTLE = "thermal_throttle"
    POWER_CAP = "power_cap"
    SLOW_GPU = "slow_gpu"
    NETWORK_OVERHEAD = "network_overhead"
    COLLECTIVE_STALL = "collective_stall"
    ENGINE_OVERHEAD = "engine_overhead"
    # failures and changes (issue 30)
    ENGINE_DOWN = "engine_down"
    ENGINE_HANG = "engine_hang"
    ENGINE_RESTART = "engine_restart"
    GPU_FAULT = "gpu_fault"
    REQUEST_ERRORS = "request_errors"
    HOST_DOWN = "host_down"
    TELEMETRY_GAP = "telemetry_gap"
    CONFIG_CHANGE = "config_change"


CAUSES: tuple[str, ...] = tuple(cause.value for cause in Cause)
#: Causes that are a failure or a change rather than a reason for slowness: found from
#: liveness, errors and change events (:mod:`analytics.failures`), not from a latency band.
FAILURE_CAUSES: frozenset[str] = frozenset({
    Cause.ENGINE_DOWN, Cause.ENGINE_HANG, Cause.ENGINE_RESTART, Cause.GPU_FAULT,
    Cause.REQUEST_ERRORS, Cause.HOST_DOWN, Cause.TELEMETRY_GAP, Cause.CONFIG_CHANGE})
#: The reasons for slowness, in vocabulary order (what the latency attribution ranks).
LATENCY_CAUSES: tuple[str, ...] = tuple(x for x in CAUSES if x not in FAILURE_CAUSES)


def subject(key: str, value: str) -> str:
    """Format a cause subject, e.g. ``subject("host_name", "gpu-07") == "host_name=gpu-07"``."""
    return f"{key}={value}"


def parse_subject(text: str) -> tuple[str, str]:
    """Split ``"host_name=gpu-07"`` into ``("host_name", "gpu-07")``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"subject {text!r} is not of the form key=value")
    return key, value
