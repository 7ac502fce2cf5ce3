"""vLLM ``/metrics`` scraping: the engine signals of each instance, tolerant to renames.

Each engine signal (``attributes.ENGINE_*``) maps to the Prometheus names vLLM has used for it
(``attributes.VLLM_PROMETHEUS_NAMES``, newest first): the first name present in the text wins,
so ``vllm:kv_cache_usage_perc`` (V1) and ``vllm:gpu_cache_usage_perc`` (older) both work.
Samples are grouped by the ``model_name`` label. When one server exposes several engines
(data parallel, an ``engine`` label), counts and counters are summed over them and the
KV-cache usage is averaged. A signal the server does not expose is absent (never zero).

Two families need their labels read: ``vllm:request_success_total`` is kept per
``finished_reason`` (so aborted and failed requests are counted, not 0 by construction), and
``vllm:cache_config_info`` (an info gauge without ``model_name``) gives the KV capacity,
``num_gpu_blocks x block_size`` tokens summed over the server's engines, on every model's sample.
"""

from __future__ import annotations

import http.client
import logging
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fleetlens.collector.agent.liveness import EngineStatus, EngineTracker
from fleetlens.collector.agent.prometheus import ExpositionError, Sample, parse_samples
from fleetlens.pipeline.schema import attributes as a

log = logging.getLogger(__name__)
#: Signals averaged (not summed) across engines of one model.
AVERAGED = frozenset({a.ENGINE_KV_CACHE_USAGE})
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Targets scraped at once (a host rarely runs more vLLM servers than it has GPUs).
MAX_PARALLEL_SCRAPES = 8


@dataclass(frozen=True)
class EngineSample:
    """The engine signals of one (instance, model) at one instant."""

    ts_ns: int
    instance_id: str
    model_name: str
    values: dict[str, float]  # ENGINE_* name -> value
    #: vllm:request_success_total by finished_reason (summed over engines).
    finished: dict[str, float] = field(default_factory=dict)


def kv_capacity_tokens(samples: list[Sample]) -> float | None:
    """Tokens the KV cache holds, from ``vllm:cache_config_info`` samples (one per engine):
    the sum of ``num_gpu_blocks x block_size``; ``None`` when no engine reports both (vLLM
    writes ``"None"`` before its cache is sized)."""
    total, found = 0.0, False
    for sample in samples:
        try:
            blocks = int(sample.labels.get(a.VLLM_NUM_GPU_BLOCKS_LABEL, ""))
            size = int(sample.labels.get(a.VLLM_BLOCK_SIZE_LABEL, ""))
        except ValueError:
            continue
        total += blocks * size
        found = True
    return total if found else None


def engine_samples(text: str, instance_id: str, ts_ns: int) -> list[EngineSample]:
    """Extract the engine signals from one ``/metrics`` body.

    Args:
        text: Prometheus exposition text.
        instance_id: the ``fleetlens.instance_id`` of the server.
        ts_ns: scrape time.

    Returns:
        One sample per ``model_name`` seen (sorted), carrying the signals found.
    """
    return samples_of_page(parse_page(text), instance_id, ts_ns)


def parse_page(text: str) -> dict[str, list[Sample]]:
    """A page's samples grouped by name. Raises :class:`ExpositionError` on a bad page."""
    grouped: dict[str, list[Sample]] = defaultdict(list)
    for sample in parse_samples(text):
        grouped[sample.name].append(sample)
    return grouped


def samples_of_page(by_name: dict[str, list[Sample]], instance_id: str,
                    ts_ns: int) -> list[EngineSample]:
    """:func:`engine_samples` of a page already parsed by :func:`parse_page`."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for signal, names in a.VLLM_PROMETHEUS_NAMES.items():
        found = next((by_name[n] for n in names if n in by_name), [])
        for sample in found:
            model = sample.labels.get(a.VLLM_MODEL_LABEL, "")
            values[model][signal].append(sample.value)
    finished: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for sample in by_name.get(a.VLLM_REQUEST_SUCCESS, []):
        model = sample.labels.get(a.VLLM_MODEL_LABEL, "")
        reason = sample.labels.get(a.VLLM_FINISHED_REASON_LABEL, "")
        finished[model][reason] += sample.value
        values.setdefault(model, defaultdict(list))  # a model seen only here gets a sample
    capacity = kv_capacity_tokens(by_name.get(a.VLLM_CACHE_CONFIG_INFO, []))
    out = []
    for model in sorted(values):
        merged = {
            signal: (sum(vs) / len(vs) if signal in AVERAGED else sum(vs))
            for signal, vs in values[model].items()
        }
        if capacity is not None:
            merged[a.ENGINE_KV_CACHE_CAPACITY] = capacity
        out.append(EngineSample(ts_ns, instance_id, model, merged, dict(finished[model])))
    return out


def fetch_text(url: str, timeout_s: float) -> str:
    """GET ``url`` and return its body (bounded in size and, as a whole, in time).

    The socket timeout bounds each read only, so a server that drips a byte a second would
    hold a plain ``read()`` (and every target after it) for as long as it likes.

    Raises:
        TimeoutError: the whole exchange took longer than ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    chunks: list[bytes] = []
    size = 0
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        while chunk := response.read1(64 * 1024):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ExpositionError(f"{url}: body larger than {MAX_BODY_BYTES} bytes")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: body not complete after {timeout_s:g} s")
    return b"".join(chunks).decode("utf-8", errors="replace")


def timed_out(exc: BaseException) -> bool:
    """Whether a failed scrape timed out (urllib wraps a connect time-out in a URLError)."""
    reason = getattr(exc, "reason", None)
    return isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError)


class VllmScraper:
    """Scrapes a set of ``(instance_id, metrics_url)`` targets.

    A target that fails (down, timeout, bad text) is logged when it starts failing and when it
    recovers, and contributes no sample meanwhile; the others go on. Each target's liveness,
    start time and configuration are kept by an :class:`EngineTracker` (:meth:`statuses`).
    """

    def __init__(self, targets: list[tuple[str, str]], timeout_s: float = 2.0,
                 clock_ns: Callable[[], int] = time.time_ns,
                 fetch: Callable[[str, float], str] = fetch_text) -> None:
        self.targets = targets
        self.timeout_s = timeout_s
        self._clock_ns = clock_ns
        self._fetch = fetch
        self.failing: set[str] = set()  # updated from the scraping threads (set ops are atomic)
        self._pool: ThreadPoolExecutor | None = None
        # one per target, each touched only by the thread scraping that target
        self.trackers = {target: EngineTracker(*target, fetch=fetch, timeout_s=timeout_s)
                         for target in targets}

    def scrape(self) -> list[EngineSample]:
        """One round over every target, side by side: the round (and the collection time
        its points are stamped with) lasts as long as the slowest target, not their sum."""
        if len(self.targets) <= 1:
            results = [self._one(*target) for target in self.targets]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(min(len(self.targets), MAX_PARALLEL_SCRAPES),
                                                thread_name_prefix="scrape")
            results = list(self._pool.map(lambda target: self._one(*target), self.targets))
        return [sample for samples in results for sample in samples]

    def _one(self, instance_id: str, url: str) -> list[EngineSample]:
        ts_ns = self._clock_ns()
        tracker = self.trackers[(instance_id, url)]
        try:
            page = parse_page(self._fetch(url, self.timeout_s))
        # HTTPException: a reply that is not HTTP, or a body cut short.
        except (OSError, urllib.error.URLError, http.client.HTTPException,
                ExpositionError) as exc:
            tracker.failed(timed_out=timed_out(exc))
            if url not in self.failing:
                log.warning("vLLM %s (%s): scrape failed: %s", instance_id, url, exc)
                self.failing.add(url)
            return []
        if url in self.failing:
            log.warning("vLLM %s (%s): scraping again", instance_id, url)
            self.failing.discard(url)
        samples = samples_of_page(page, instance_id, ts_ns)
        tracker.scraped(page, [s.model_name for s in samples])
        return samples

    def statuses(self) -> list[EngineStatus]:
        """Every target's liveness after the last round (call it between rounds)."""
        return [tracker.status() for tracker in self.trackers.values()]

    def close(self) -> None:
        """Stop the scraping threads (the agent calls it at shutdown)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
