"""The agent's loops: sample GPUs (NVML, or dcgm-exporter with ``dcgm``), scrape vLLM, keep the
instance -> GPU mapping, export."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.resources import Resource

from fleetlens.collector.agent.config import AgentConfig, VllmTarget, is_loopback
from fleetlens.collector.agent.dcgm import EXTRA_GAUGES, DcgmSource
from fleetlens.collector.agent.export import MetricGroup, Outbox
from fleetlens.collector.agent.gpu import GpuBackend, NoGpu
from fleetlens.collector.agent.health_instruments import register_gpu_health, register_liveness
from fleetlens.collector.agent.instruments import (
    EngineState,
    GpuState,
    register_engine,
    register_gpu,
)
from fleetlens.collector.agent.mapping import (
    gpus_from_config,
    gpus_from_pids,
    gpus_from_pod,
    listening_pids,
    url_port,
    with_descendants,
)
from fleetlens.collector.agent.sampler import GpuSampler
from fleetlens.collector.agent.scraper import VllmScraper
from fleetlens.pipeline.schema import attributes as a

log = logging.getLogger(__name__)
#: Seconds between attempts to open NVML when it was not available at start.
GPU_RETRY_S = 60.0


def otlp_exporter(config: AgentConfig) -> MetricExporter:
    """The OTLP/gRPC metric exporter towards ``config.collector`` (token and TLS applied)."""
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    credentials = None
    if config.uses_tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(config.tls_ca_file),
            private_key=read(config.tls_key_file),
            certificate_chain=read(config.tls_cert_file),
        )
    headers = (("authorization", f"Bearer {config.auth_token}"),) if config.auth_token else None
    return OTLPMetricExporter(endpoint=config.collector, insecure=not config.uses_tls,
                              credentials=credentials, headers=headers,
                              timeout=config.export_timeout_s)


class Agent:
    """One host's agent. ``backend`` is ``None`` when there is no GPU (scraping only) or when
    ``config.dcgm`` makes dcgm-exporter the GPU source."""

    def __init__(self, config: AgentConfig, backend: GpuBackend | None,
                 exporter_factory: Callable[[AgentConfig], MetricExporter] = otlp_exporter,
                 reopen_gpus: Callable[[], GpuBackend] | None = None) -> None:
        """``reopen_gpus``, when there is no backend yet: called every :data:`GPU_RETRY_S`
        until it returns one (raising :class:`NoGpu` meanwhile), for a driver that loads
        after the agent starts."""
        self.config = config
        self.host_name = config.resolved_host_name()
        resource = Resource.create({a.SERVICE_NAME: config.service_name,
                                    a.HOST_NAME: self.host_name, **config.resource_attributes})
        self.gpu_state, self.engine_state = GpuState(), EngineState()
        self.gpu_group = MetricGroup(resource, "fleetlens.agent.gpu")
        self.engine_group = MetricGroup(resource, "fleetlens.agent.engine")
        register_gpu(self.gpu_group, self.gpu_state, EXTRA_GAUGES)
        register_gpu_health(self.gpu_group, lambda: self.gpu_state.health)
        register_engine(self.engine_group, self.engine_state)
        register_liveness(self.engine_group, lambda: self.engine_state.statuses)
        #: GPU health (Xid, ECC, remapped rows, lost) is read this often, not at every sample.
        self.health_interval_s = config.export_interval_s
        self._next_health = 0.0
        box = dict(interval_s=config.export_interval_s, timeout_s=config.export_timeout_s,
                   max_pending=config.max_pending_collections)
        self.gpu_outbox = Outbox(exporter_factory(config), name="gpu", **box)
        self.engine_outbox = Outbox(exporter_factory(config), name="engine", **box)
        self.sampler: GpuSampler | DcgmSource | None = (
            GpuSampler(backend) if backend is not None else None)
        self.gpu_interval_s = config.gpu_interval_s
        if config.dcgm:
            # dcgm-exporter refreshes its fields every 30 s by default: 10 Hz would re-read them.
            self.sampler = DcgmSource(config.dcgm_metrics_url, timeout_s=config.scrape_timeout_s)
            self.gpu_interval_s = config.scrape_interval_s
        self.targets: dict[str, VllmTarget] = {
            t.resolved_instance_id(self.host_name): t for t in config.vllm}
        self.scraper = VllmScraper([(i, t.metrics_url) for i, t in self.targets.items()],
                                   timeout_s=config.scrape_timeout_s)
        self._stop = threading.Event()
        self._next_mapping = 0.0
        self._reopen_gpus = reopen_gpus if self.sampler is None else None
        self._next_gpu_try = time.monotonic() + GPU_RETRY_S
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()

    # --- one step of each loop (tests drive these directly) --------------------------------
    def gpu_tick(self) -> None:
        """Sample every GPU and queue one collection."""
        if self.sampler is None:
            return
        self.gpu_state.samples = self.sampler.sample()
        now = time.monotonic()
        self.gpu_state.health = []
        if now >= self._next_health:
            self._next_health = now + self.health_interval_s
            self.gpu_state.health = self.sampler.health()
        self.gpu_outbox.put(self.gpu_group.collect())

    def engine_tick(self) -> None:
        """Scrape every vLLM and queue one collection (engine metrics, liveness, the
        mapping and the agent's heartbeat, which goes out even with nothing to scrape)."""
        self.engine_state.samples = self.scraper.scrape()
        self.engine_state.statuses = self.scraper.statuses()
        self.engine_outbox.put(self.engine_group.collect())

    def refresh_mapping(self) -> None:
        """Recompute instance -> GPU UUIDs from config, else from NVML's PIDs."""
        gpus = self.gpu_state.samples
        mapping = {}
        for instance, target in self.targets.items():
            if target.gpus:
                mapping[instance] = gpus_from_config(target.gpus, gpus)
            elif target.pod:
                mapping[instance] = gpus_from_pod(target.pod, gpus)
            elif gpus and _is_local(target.url):
                pids = with_descendants(listening_pids(url_port(target.url)))
                mapping[instance] = gpus_from_pids(pids, gpus)
        changed = mapping != self.engine_state.mapping
        self.engine_state.mapping = {k: v for k, v in mapping.items() if v}
        if changed:
            log.info("instance -> GPU mapping: %s", self.engine_state.mapping)

    # --- running ---------------------------------------------------------------------------
    def run(self) -> int:
        """Run until :meth:`stop`; then flush what is queued. Returns how many collections
        could not be delivered."""
        self.gpu_outbox.start()
        self.engine_outbox.start()
        self._start_loop("engine", self.engine_tick_with_mapping, self.config.scrape_interval_s)
        if self.sampler is not None:
            self._start_loop("gpu", self.gpu_tick, self.gpu_interval_s)
        self._stop.wait()
        with self._threads_lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()
        for outbox in (self.gpu_outbox, self.engine_outbox):
            outbox.begin_stop()  # both threads end side by side, not one after the other
        undelivered = self.gpu_outbox.stop() + self.engine_outbox.stop()
        self.scraper.close()
        if self.sampler is not None:
            self.sampler.close()
        return undelivered

    def _start_loop(self, name: str, tick: Callable[[], None], interval_s: float) -> None:
        with self._threads_lock:
            if self._stop.is_set():
                return
            thread = threading.Thread(target=self._loop, args=(tick, interval_s), name=name,
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def try_gpus_again(self) -> None:
        """Without GPUs since start: try NVML again every :data:`GPU_RETRY_S` (a driver that
        loads after the agent, or comes back after an upgrade), and start sampling when up."""
        if self._reopen_gpus is None or time.monotonic() < self._next_gpu_try:
            return
        self._next_gpu_try = time.monotonic() + GPU_RETRY_S
        try:
            backend = self._reopen_gpus()
        except NoGpu as exc:
            log.debug("still no GPU: %s", exc)
            return
        self._reopen_gpus = None
        self.sampler = GpuSampler(backend)
        log.warning("NVML is available now: sampling %d GPU(s)", backend.device_count())
        self._start_loop("gpu", self.gpu_tick, self.config.gpu_interval_s)

    def engine_tick_with_mapping(self) -> None:
        """:meth:`engine_tick`, refreshing the mapping every ``mapping_interval_s`` (and,
        without GPUs, trying NVML again now and then)."""
        self.try_gpus_again()
        now = time.monotonic()
        # GPU indices and PIDs resolve only against samples: wait for the first ones.
        if now >= self._next_mapping and (self.sampler is None or self.gpu_state.samples):
            self._next_mapping = now + self.config.mapping_interval_s
            self.refresh_mapping()
        self.engine_tick()

    def _loop(self, tick: Callable[[], None], interval_s: float) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                tick()
            except Exception:  # one bad tick must not end the agent; it is logged in full
                log.exception("agent tick failed")
            next_at += interval_s
            now = time.monotonic()
            if next_at < now:  # fell behind: skip missed ticks rather than bursting
                next_at = now
            self._stop.wait(next_at - now)

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self._stop.set()


def _is_local(url: str) -> bool:
    """Whether ``url`` points at this machine (only then can its PIDs be looked up)."""
    host = urlsplit(url).hostname or ""
    return is_loopback(host) or host in ("0.0.0.0", "::", socket.gethostname())
