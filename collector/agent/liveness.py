"""Engine liveness, start time and configuration, per scraped vLLM (issue 30).

Each target has an :class:`EngineTracker`, fed by the scraper after every scrape:

- ``up``: whether the last scrape of ``/metrics`` worked (Prometheus' ``up``). The instance
  id comes from the configuration, so a target down since the agent started still has a
  series; its ``model_name`` values are those of its last good scrape (none before one).
- the start time: the page's ``process_start_time_seconds`` (Prometheus' process collector,
  which vLLM's API server serves); a new value is a restart.
- the configuration: ``vllm:cache_config_info``'s labels (every scrape, they are on the page),
  plus what ``GET /version`` (``{"version": ...}``) and ``GET /v1/models`` (``data[].id`` and
  ``max_model_len``) answer. Those two are fetched when the engine is first seen up, when it
  comes back up, when its start time changes, and every :data:`INFO_REFRESH_S` (sooner,
  :data:`INFO_RETRY_S`, after a failure); a failed fetch keeps the previous answer.

The configuration goes out as one sorted-keys JSON object (``cache_config``, ``models``:
id -> max_model_len, ``version``; each only when known) and its fingerprint, the first 16 hex
digits of the JSON's SHA-256, so any change of labels, models or version changes it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetlens.collector.agent.prometheus import Sample
from fleetlens.pipeline.schema import attributes as a

log = logging.getLogger(__name__)
INFO_REFRESH_S = 300.0
INFO_RETRY_S = 30.0
VERSION_PATH = "/version"
MODELS_PATH = "/v1/models"
#: vLLM's data-parallel engine label: the same configuration on every engine of a server.
ENGINE_LABEL = "engine"
FINGERPRINT_DIGITS = 16
_FETCH_ERRORS = (OSError, urllib.error.URLError, http.client.HTTPException, ValueError,
                 KeyError, TypeError)


@dataclass(frozen=True)
class EngineConfig:
    """An engine's configuration as exported (``fleetlens.engine.config`` attributes)."""

    fingerprint: str
    version: str | None
    json: str


@dataclass(frozen=True)
class EngineStatus:
    """One target at one scrape: start time and configuration only while it is up."""

    instance_id: str
    up: bool
    models: tuple[str, ...] = ()
    start_time_s: float | None = None
    config: EngineConfig | None = None
    #: the last scrape timed out: the port took the connection, the process never answered
    unresponsive: bool = False


def start_time(by_name: dict[str, list[Sample]]) -> float | None:
    """``process_start_time_seconds`` from a parsed page, when it has one."""
    samples = by_name.get(a.VLLM_PROCESS_START_TIME, [])
    return samples[0].value if samples else None


def cache_config(by_name: dict[str, list[Sample]]) -> dict | list | None:
    """``vllm:cache_config_info``'s labels: one object when every engine has the same
    (their ``engine`` label aside), else each engine's labels, sorted."""
    samples = by_name.get(a.VLLM_CACHE_CONFIG_INFO, [])
    if not samples:
        return None
    shared = {json.dumps({k: v for k, v in s.labels.items() if k != ENGINE_LABEL},
                         sort_keys=True) for s in samples}
    if len(shared) == 1:
        return json.loads(shared.pop())
    return sorted((dict(s.labels) for s in samples), key=lambda labels: json.dumps(
        labels, sort_keys=True))


def engine_config(cache: Any, models: dict[str, int | None] | None,
                  version: str | None) -> EngineConfig | None:
    """The exported configuration, or ``None`` when nothing of it is known."""
    parts = {"cache_config": cache, "models": models, "version": version}
    known = {k: v for k, v in parts.items() if v is not None}
    if not known:
        return None
    text = json.dumps(known, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_DIGITS]
    return EngineConfig(digest, version, text)


def parse_version(text: str) -> str:
    """vLLM's ``/version`` answer: ``{"version": "0.32.0"}``."""
    return str(json.loads(text)["version"])


def parse_models(text: str) -> dict[str, int | None]:
    """vLLM's ``/v1/models`` answer: served model id -> ``max_model_len``."""
    return {str(m["id"]): m.get("max_model_len") for m in json.loads(text)["data"]}


def base_url(metrics_url: str) -> str:
    """The server's root, from its ``/metrics`` URL."""
    return metrics_url.rstrip("/").removesuffix("/metrics")


class EngineTracker:
    """The liveness and configuration of one target (see the module docstring)."""

    def __init__(self, instance_id: str, metrics_url: str, fetch: Callable[[str, float], str],
                 timeout_s: float, clock: Callable[[], float] | None = None) -> None:
        self.instance_id = instance_id
        self._base = base_url(metrics_url)
        # time.monotonic looked up at each call, so a test can move the clock on
        self._clock = clock or (lambda: time.monotonic())
        self._fetch, self._timeout_s = fetch, timeout_s
        self.up = self.unresponsive = False
        self.models: tuple[str, ...] = ()
        self.start_time_s: float | None = None
        self._cache: Any = None
        self.version: str | None = None
        self.served: dict[str, int | None] | None = None
        self._next_info: float | None = None  # None: never fetched
        self._failing: set[str] = set()

    def failed(self, timed_out: bool = False) -> None:
        """The scrape failed: down (the last models, version and models served are kept);
        ``timed_out``: it took the connection and never answered (stopped or stuck)."""
        self.up, self.unresponsive = False, timed_out

    def scraped(self, by_name: dict[str, list[Sample]], models: list[str]) -> None:
        """The scrape worked: ``by_name`` is the parsed page, ``models`` its model names."""
        came_up, self.up, self.unresponsive = not self.up, True, False
        if models:
            self.models = tuple(sorted(set(models)))
        start = start_time(by_name)
        restarted = start != self.start_time_s
        self.start_time_s, self._cache = start, cache_config(by_name)
        if came_up or restarted or self._next_info is None or self._clock() >= self._next_info:
            self._refresh_info()

    def _refresh_info(self) -> None:
        version = self._get(VERSION_PATH, parse_version)
        served = self._get(MODELS_PATH, parse_models)
        self.version = version if version is not None else self.version
        self.served = served if served is not None else self.served
        ok = version is not None and served is not None
        self._next_info = self._clock() + (INFO_REFRESH_S if ok else INFO_RETRY_S)

    def _get(self, path: str, parse: Callable[[str], Any]) -> Any:
        url = self._base + path
        try:
            value = parse(self._fetch(url, self._timeout_s))
        except _FETCH_ERRORS as exc:
            if path not in self._failing:  # once per outage, not at every retry
                log.info("vLLM %s: %s not read (%s); keeping the previous answer",
                         self.instance_id, url, exc)
                self._failing.add(path)
            return None
        self._failing.discard(path)
        return value

    def status(self) -> EngineStatus:
        """The target now, as the instruments read it."""
        if not self.up:
            return EngineStatus(self.instance_id, False, self.models,
                                unresponsive=self.unresponsive)
        return EngineStatus(self.instance_id, True, self.models, self.start_time_s,
                            engine_config(self._cache, self.served, self.version))
