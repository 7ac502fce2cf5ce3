"""Scenario files (TOML): the fleet, its deployments, workloads and injected incidents.

See docs/simulator.md for every key. :func:`load_scenario` reads a file, :func:`parse_scenario`
a dict; both reject unknown keys and bad values with a message naming the place.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import time
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetlens.pipeline.schema import CAUSES
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.timegrammar import parse_time
from fleetlens.simulator.specs import GPU_PRESETS, MODEL_PRESETS, GpuSpec, ModelSpec, from_preset


class ScenarioError(ValueError):
    """A scenario file is invalid; the message names the table and key."""


@dataclass(frozen=True)
class Host:
    """One machine: ``gpus`` GPUs of one model, and its dimensions (region, device_type...)."""

    name: str
    gpus: int
    gpu: GpuSpec
    dims: dict[str, str]


@dataclass(frozen=True)
class Deployment:
    """One service: a model served by vLLM-like instances of ``tp`` GPUs on ``hosts``."""

    service: str
    model: ModelSpec
    hosts: tuple[str, ...]
    tp: int = 1
    instances_per_host: int = 0  # 0: as many as the host's free GPUs allow
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    kv_blocks: int = 0  # 0: derived from GPU memory and gpu_memory_utilization
    gpu_memory_utilization: float = 0.9
    prefix_caching: bool = True
    step_overhead_ms: float = 2.0
    mfu: float = 0.6
    bandwidth_efficiency: float = 0.75
    version: str = "0.11.0"  # what the engine's GET /version answers (fleetlens.engine.config)


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: ``fixed`` (value), ``uniform`` (min..max) or
    ``lognormal`` (median, sigma), always clipped to [min, max]."""

    dist: str = "lognormal"
    value: int = 0
    median: float = 512.0
    sigma: float = 0.8
    min: int = 1
    max: int = 8192


@dataclass(frozen=True)
class Workload:
    """Requests to one service: a Poisson process (with seasonality and random bursts) or a
    replayed trace."""

    service: str
    rate: float = 1.0
    daily_amplitude: float = 0.0
    peak_hour: float = 15.0
    bursts_per_hour: float = 0.0
    burst_factor: float = 2.0
    burst_duration_s: float = 30.0
    prompt: LengthDist = field(default_factory=LengthDist)
    output: LengthDist = field(default_factory=lambda: LengthDist(median=200.0, max=2048))
    prefix_groups: int = 0
    prefix_tokens: int = 0
    prefix_share: float = 0.0
    gateway_share: float = 0.0
    gateway_service: str = "llm-gateway"
    gateway_timeout_s: float = 30.0  # the gateway answers 504 after this (a hung engine)
    gateway_failover: bool = False  # route away from an engine whose health check fails ...
    gateway_health_delay_s: float = 10.0  # ... once it has failed this long
    max_tokens: int = 4096
    temperature: float = 0.7
    top_p: float = 1.0
    replay: str = ""
    format: str = ""
    time_scale: float = 1.0


@dataclass(frozen=True)
class Incident:
    """An injected fault: a cause of the vocabulary, its target, window and magnitude."""

    kind: str
    start_s: float
    duration_s: float
    magnitude: float
    service: str = ""
    host: str = ""
    gpu: int = -1
    set: Any = None  # config_change: {setting: value}, checked with the fleet (engine_config)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


#: Default magnitude per kind and what it means (docs/simulator.md).
DEFAULT_MAGNITUDE: dict[str, float] = {
    "traffic_surge": 3.0,  # arrival-rate multiplier
    "kv_cache_pressure": 0.85,  # share of KV blocks taken away
    "prefix_cache_drop": 1.0,  # share of requests whose shared prefix changed
    "long_prompts": 4.0,  # prompt-length multiplier
    "thermal_throttle": 40.0,  # inlet temperature rise, Celsius
    "power_cap": 0.45,  # power limit as a share of TDP
    "slow_gpu": 0.5,  # share of bandwidth and FLOP/s the GPU still delivers
    "network_overhead": 0.25,  # extra one-way gateway -> engine delay, seconds
    "collective_stall": 25.0,  # interconnect slowdown factor
    "engine_overhead": 0.03,  # extra CPU seconds per engine step
    # failures (simulator.failures, .gpu_fault, .config_change): only request_errors reads it
    "engine_down": 1.0, "engine_hang": 1.0, "host_down": 1.0, "telemetry_gap": 1.0,
    "gpu_fault": 1.0, "config_change": 1.0, "request_errors": 0.2,  # share of requests aborted
}
#: Which target each kind takes: service-wide, or a host / one GPU.
SERVICE_KINDS = frozenset({"traffic_surge", "long_prompts"})
GPU_KINDS = frozenset({"thermal_throttle", "power_cap", "slow_gpu"})


@dataclass(frozen=True)
class Scenario:
    """A whole scenario. ``seed`` is the default seed; ``sha256`` identifies the content."""

    name: str
    start_ns: int
    duration_s: float
    drain_s: float
    sample_interval_s: float
    tick_s: float
    seed: int
    hosts: tuple[Host, ...]
    deployments: tuple[Deployment, ...]
    workloads: tuple[Workload, ...]
    incidents: tuple[Incident, ...]
    sha256: str
    base_dir: Path

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a TOML scenario file.

    Raises:
        ScenarioError: unreadable file, bad TOML, or an invalid value (naming where).
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: invalid TOML: {exc}") from None
    return parse_scenario(raw, base_dir=path.resolve().parent)


def parse_scenario(raw: dict[str, Any], base_dir: str | Path = ".") -> Scenario:
    """Build a :class:`Scenario` from a parsed TOML document (see :func:`load_scenario`)."""
    _known(raw, {"fleet", "deployment", "workload", "incident"}, "scenario")
    fleet = dict(raw.get("fleet") or {})
    _known(fleet, {"name", "start", "duration_s", "drain_s", "sample_interval_s", "tick_s",
                   "seed", "hosts"}, "[fleet]")
    hosts = tuple(h for i, entry in enumerate(fleet.get("hosts") or [])
                  for h in _hosts(entry, f"[[fleet.hosts]] #{i + 1}"))
    if not hosts:
        raise ScenarioError("[fleet]: at least one entry in [[fleet.hosts]] is required")
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise ScenarioError("[fleet]: host names must be unique")
    deployments = tuple(_deployment(d, names, f"[[deployment]] #{i + 1}")
                        for i, d in enumerate(raw.get("deployment") or []))
    services = {d.service for d in deployments}
    if len(services) != len(deployments):
        raise ScenarioError("[[deployment]]: service names must be unique")
    workloads = tuple(_build(Workload, w, f"[[workload]] #{i + 1}", _workload_fields)
                      for i, w in enumerate(raw.get("workload") or []))
    for i, w in enumerate(workloads):
        _check_workload(w, services, f"[[workload]] #{i + 1}")
    hosts_by_name = {h.name: h for h in hosts}
    incidents = tuple(_incident(x, services, hosts_by_name, f"[[incident]] #{i + 1}")
                      for i, x in enumerate(raw.get("incident") or []))
    scenario = Scenario(
        name=str(fleet.get("name", "scenario")),
        start_ns=_start_ns(fleet.get("start", "2026-01-05T14:00:00Z")),
        duration_s=_positive(fleet.get("duration_s", 600.0), "[fleet].duration_s"),
        drain_s=float(fleet.get("drain_s", 120.0)),
        sample_interval_s=_positive(fleet.get("sample_interval_s", 10.0),
                                    "[fleet].sample_interval_s"),
        tick_s=_positive(fleet.get("tick_s", 1.0), "[fleet].tick_s"),
        seed=int(fleet.get("seed", 0)),
        hosts=hosts, deployments=deployments, workloads=workloads, incidents=incidents,
        sha256=_digest(raw, workloads, Path(base_dir)),
        base_dir=Path(base_dir),
    )
    if scenario.sample_interval_s < scenario.tick_s:
        raise ScenarioError("[fleet]: sample_interval_s must be >= tick_s")
    return scenario


def _digest(raw: dict[str, Any], workloads: tuple[Workload, ...], base_dir: Path) -> str:
    """sha256 of the scenario's content and of every replayed trace file it names."""
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode())
    for w in workloads:
        path = Path(w.replay) if Path(w.replay).is_absolute() else base_dir / w.replay
        if w.replay and path.is_file():
            with open(path, "rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def _known(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {unknown}")


def _positive(value: Any, where: str) -> float:
    if not isinstance(value, int | float) or value <= 0:
        raise ScenarioError(f"{where}: must be a positive number, got {value!r}")
    return float(value)


NS_PER_S = 1_000_000_000


def parse_start(value: Any) -> int:
    """A start time in ns: an ISO time (UTC unless it says otherwise), ``now``, or ``now-6h``
    (the one time grammar of :mod:`pipeline.schema.timegrammar`; relative starts are rounded
    down to the minute and not reproducible).

    Raises:
        ScenarioError: not a time.
    """
    return _start_ns(value)


def _start_ns(value: Any) -> int:
    if isinstance(value, datetime):  # a TOML datetime
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(moment.timestamp()) * NS_PER_S + moment.microsecond * 1000
    text = str(value).strip()
    try:
        ns = parse_time(text)
    except ValueError as exc:
        raise ScenarioError(f"[fleet].start: {exc}") from None
    if ns > time.time_ns() + 60 * NS_PER_S:  # collectors refuse data from the future
        raise ScenarioError(f"[fleet].start: {text!r} is in the future")
    if text.startswith("now"):
        return ns // (60 * NS_PER_S) * 60 * NS_PER_S
    return ns


def _hosts(entry: dict[str, Any], where: str) -> list[Host]:
    entry = dict(entry)
    gpu = _resolve(GPU_PRESETS, entry.pop("gpu", "H100-SXM"), GpuSpec, f"{where}.gpu")
    gpus = entry.pop("gpus", 8)
    if not isinstance(gpus, int) or gpus < 1:
        raise ScenarioError(f"{where}.gpus: must be a positive integer")
    if "name" in entry:
        names = [str(entry.pop("name"))]
    else:
        prefix, count = str(entry.pop("prefix", "h")), entry.pop("count", 1)
        first = int(entry.pop("first", 1))
        names = [f"{prefix}{i:02d}" for i in range(first, first + int(count))]
    dims = {str(k): str(v) for k, v in entry.items() if not isinstance(v, dict | list)}
    if len(dims) != len(entry):
        raise ScenarioError(f"{where}: dimensions must be plain values")
    dims.setdefault(c.GPU_MODEL, gpu.name)
    return [Host(name, gpus, gpu, dims) for name in names]


def _resolve(presets: dict[str, Any], value: Any, cls: type, where: str) -> Any:
    try:
        return from_preset(presets, value, cls, where)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def _deployment(entry: dict[str, Any], host_names: list[str], where: str) -> Deployment:
    entry = dict(entry)
    if "service" not in entry:
        raise ScenarioError(f"{where}: 'service' is required")
    model = _resolve(MODEL_PRESETS, entry.pop("model", "llama-3.1-8b"), ModelSpec,
                     f"{where}.model")
    patterns = entry.pop("hosts", ["*"])
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    hosts = tuple(h for h in host_names if any(fnmatch.fnmatchcase(h, p) for p in patterns))
    if not hosts:
        raise ScenarioError(f"{where}.hosts: {patterns} match no host")
    deployment = _build(Deployment, {**entry, "model": model, "hosts": hosts}, where, None)
    if deployment.tp < 1 or deployment.max_num_seqs < 1 or deployment.max_num_batched_tokens < 16:
        raise ScenarioError(f"{where}: tp, max_num_seqs and max_num_batched_tokens must be > 0")
    return deployment


def _workload_fields(key: str, value: Any, where: str) -> Any:
    if key in ("prompt", "output"):
        if not isinstance(value, dict):
            raise ScenarioError(f"{where}.{key}: expected a table")
        dist = _build(LengthDist, value, f"{where}.{key}", None)
        bad = dist.dist not in ("fixed", "uniform", "lognormal")
        if bad or dist.min < 1 or dist.max < dist.min:
            raise ScenarioError(f"{where}.{key}: bad distribution {value!r}")
        return dist
    return value


def _check_workload(w: Workload, services: set[str], where: str) -> None:
    if w.service not in services:
        raise ScenarioError(f"{where}.service: no deployment named {w.service!r}")
    if w.replay and w.format not in ("azure", "mooncake"):
        raise ScenarioError(f"{where}.format: must be 'azure' or 'mooncake' with replay")
    if not w.replay and w.rate <= 0:
        raise ScenarioError(f"{where}.rate: must be positive")
    for name in ("prefix_share", "gateway_share", "daily_amplitude"):
        if not 0.0 <= getattr(w, name) <= 1.0:
            raise ScenarioError(f"{where}.{name}: must be within 0..1")
    if w.gateway_timeout_s <= 0 or w.gateway_health_delay_s < 0:
        raise ScenarioError(f"{where}: gateway_timeout_s must be positive and "
                            "gateway_health_delay_s >= 0")


def _incident(entry: dict[str, Any], services: set[str], hosts: dict[str, Host],
              where: str) -> Incident:
    entry = dict(entry)
    kind = entry.get("kind")
    if kind not in CAUSES:
        raise ScenarioError(f"{where}.kind: {kind!r} is not one of {list(CAUSES)}")
    if kind not in DEFAULT_MAGNITUDE:
        raise ScenarioError(f"{where}.kind: {kind!r} is not simulated (yet); simulated: "
                            f"{sorted(DEFAULT_MAGNITUDE)}")
    entry.setdefault("magnitude", DEFAULT_MAGNITUDE[kind])
    gpu = entry.pop("gpu", None)
    if gpu is not None:  # "h03:2" -> host h03, GPU index 2
        host_name, _, index = str(gpu).partition(":")
        if not index.isdigit():
            raise ScenarioError(f"{where}.gpu: expected 'host:index', got {gpu!r}")
        entry["host"], entry["gpu"] = host_name, int(index)
    incident = _build(Incident, entry, where, None)
    if incident.service and incident.service not in services:
        raise ScenarioError(f"{where}.service: no deployment named {incident.service!r}")
    if incident.host and incident.host not in hosts:
        raise ScenarioError(f"{where}.host: no host named {incident.host!r}")
    if incident.gpu >= 0 and incident.gpu >= hosts[incident.host].gpus:
        raise ScenarioError(f"{where}.gpu: host {incident.host} has no GPU {incident.gpu}")
    if kind in SERVICE_KINDS and not incident.service:
        raise ScenarioError(f"{where}: {kind} needs a 'service' target")
    if kind not in SERVICE_KINDS and not (incident.host or incident.service):
        raise ScenarioError(f"{where}: {kind} needs a 'host' (or 'gpu') target")
    if kind in GPU_KINDS and not incident.host:
        raise ScenarioError(f"{where}: {kind} needs a 'host' or 'gpu' target")
    if incident.duration_s <= 0 or incident.start_s < 0:
        raise ScenarioError(f"{where}: start_s must be >= 0 and duration_s > 0")
    return incident


def _build(cls: type, values: dict[str, Any], where: str, convert: Any) -> Any:
    allowed = set(cls.__dataclass_fields__)
    _known(values, allowed, where)
    if convert is not None:
        values = {k: convert(k, v, where) for k, v in values.items()}
    try:
        obj = cls(**values)
    except TypeError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    for name, spec in cls.__dataclass_fields__.items():
        value, expected = getattr(obj, name), spec.type
        if expected in ("int", "float") and not isinstance(value, int | float):
            raise ScenarioError(f"{where}.{name}: expected a number, got {value!r}")
        if expected == "str" and not isinstance(value, str):
            raise ScenarioError(f"{where}.{name}: expected a string, got {value!r}")
        if expected == "bool" and not isinstance(value, bool):
            raise ScenarioError(f"{where}.{name}: expected true/false, got {value!r}")
    return obj
