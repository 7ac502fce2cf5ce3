"""Host agent configuration (the ``[agent]`` table of ``fleetlens.toml``).

Example::

    [agent]
    collector = "collector.internal:4317"
    tls = true
    tls_ca_file = "/etc/fleetlens/ca.pem"
    auth_token = "s3cret"            # or FLEETLENS_AGENT__AUTH_TOKEN
    gpu_interval_s = 0.1

    [[agent.vllm]]
    url = "http://127.0.0.1:8000"
    instance_id = "gpu-07/llama-70b-0"   # = the vLLM's service.instance.id
    gpus = ["0", "1"]                    # indices or UUIDs; empty: found from NVML PIDs

With NVIDIA's dcgm-exporter already on the host, ``dcgm = "http://127.0.0.1:9400/metrics"``
makes it the GPU source instead of NVML, and ``pod = "namespace/name"`` on a target maps it to
the GPUs that pod uses.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fleetlens.pipeline.schema.settings import is_loopback as settings_is_loopback
from fleetlens.pipeline.schema.settings import require

LOOPBACK = "127.0.0.1"
DEFAULT_VLLM_SERVICE = "vllm"
AGENT_SERVICE = "fleetlens-agent"


def split_host_port(address: str) -> tuple[str, int] | None:
    """``"host:port"`` (``[v6]:port`` too) as a pair, or ``None`` when malformed."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        return None
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (plaintext is acceptable there); the one
    check of :mod:`pipeline.schema.settings`, without resolving names (a client's view)."""
    return settings_is_loopback(host)


def metrics_url(url: str) -> str:
    """``url`` if it ends in ``/metrics``, else ``url`` + ``/metrics``."""
    return url if urlsplit(url).path.endswith("/metrics") else url.rstrip("/") + "/metrics"


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an http(s) URL with a host."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@dataclass(frozen=True)
class VllmTarget:
    """One local vLLM instance whose ``/metrics`` the agent scrapes."""

    #: Base URL (``http://127.0.0.1:8000``) or the full ``/metrics`` URL.
    url: str = ""
    #: Must equal the instance's spans' ``service.instance.id``; default
    #: ``"{host_name}/{service_name}"``, the collector's rule when that attribute is absent.
    instance_id: str = ""
    #: The vLLM's ``OTEL_SERVICE_NAME`` (used only to derive the default ``instance_id``).
    service_name: str = DEFAULT_VLLM_SERVICE
    #: GPUs serving it (NVML indices or UUIDs); empty means: find them from NVML's PIDs.
    gpus: tuple[str, ...] = ()
    #: Its Kubernetes pod, ``namespace/name`` or ``name``: with ``dcgm``, its GPUs are those
    #: dcgm-exporter labels with that pod.
    pod: str = ""

    @property
    def metrics_url(self) -> str:
        """The URL to scrape."""
        return metrics_url(self.url)

    def resolved_instance_id(self, host_name: str) -> str:
        """``instance_id``, else ``"{host_name}/{service_name}"``."""
        return self.instance_id or f"{host_name}/{self.service_name}"

    def validate(self) -> None:
        parts = urlsplit(self.url)
        require(parts.scheme in ("http", "https") and bool(parts.hostname), "url",
                f"expected an http(s) URL such as http://127.0.0.1:8000, got {self.url!r}")
        require(bool(self.service_name), "service_name", "must not be empty")
        require(all(g.strip() for g in self.gpus), "gpus", "GPU entries must not be empty")


@dataclass(frozen=True)
class AgentConfig:
    """Where the agent sends its metrics, how often it samples, and what it scrapes."""

    #: OTLP/gRPC endpoint of the fleetlens collector, ``HOST:PORT``.
    collector: str = f"{LOOPBACK}:4317"
    #: Bearer token sent as ``authorization`` metadata (the collector's ``auth_tokens``).
    auth_token: str | None = None
    #: Use TLS towards the collector (system roots unless ``tls_ca_file``).
    tls: bool = False
    tls_ca_file: str | None = None
    #: Client certificate and key for mutual TLS.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: Plaintext to a non-loopback collector must be asked for explicitly.
    allow_plaintext: bool = False
    #: Resource ``host.name``; empty means the machine's hostname.
    host_name: str = ""
    service_name: str = AGENT_SERVICE
    #: Extra resource attributes (``region``, ``cluster``, ...).
    resource_attributes: dict[str, str] = field(default_factory=dict)
    gpu_interval_s: float = 0.1
    scrape_interval_s: float = 1.0
    scrape_timeout_s: float = 2.0
    #: How often collected points are shipped (one OTLP request per signal group).
    export_interval_s: float = 1.0
    export_timeout_s: float = 10.0
    #: How often the instance -> GPU mapping is recomputed from NVML PIDs.
    mapping_interval_s: float = 10.0
    #: Collections held while the collector is unreachable; the oldest are dropped beyond it.
    max_pending_collections: int = 600
    #: Simulated GPUs (demos); 0 uses NVML.
    fake_gpus: int = 0
    #: dcgm-exporter URL (base or ``/metrics``): GPU samples from it instead of NVML, every
    #: ``scrape_interval_s`` (it refreshes its own fields every 30 s by default).
    dcgm: str = ""
    vllm: tuple[VllmTarget, ...] = ()

    @property
    def dcgm_metrics_url(self) -> str:
        """The dcgm-exporter URL to scrape (``/metrics`` added to a base URL)."""
        return metrics_url(self.dcgm)

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.tls_ca_file is not None or self.tls_cert_file is not None

    def resolved_host_name(self) -> str:
        """``host_name``, else the machine's hostname."""
        return self.host_name or socket.gethostname()

    def validate(self) -> None:
        hostport = split_host_port(self.collector)
        require(hostport is not None, "collector",
                f"expected HOST:PORT, got {self.collector!r}")
        assert hostport is not None
        require(self.uses_tls or self.allow_plaintext or is_loopback(hostport[0]),
                "allow_plaintext", f"plaintext OTLP to non-loopback {hostport[0]!r}: set "
                "tls = true (and tls_ca_file), or allow_plaintext = true on a trusted network")
        require(self.auth_token is None or bool(self.auth_token.strip()), "auth_token",
                "must not be empty")
        require((self.tls_cert_file is None) == (self.tls_key_file is None), "tls_cert_file",
                "tls_cert_file and tls_key_file must be set together")
        for name in ("gpu_interval_s", "scrape_interval_s", "scrape_timeout_s",
                     "export_interval_s", "export_timeout_s", "mapping_interval_s"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.max_pending_collections > 0, "max_pending_collections", "must be positive")
        require(0 <= self.fake_gpus <= 64, "fake_gpus", "must be between 0 and 64")
        require(not self.dcgm or is_http_url(self.dcgm), "dcgm", "expected an http(s) URL "
                f"such as http://127.0.0.1:9400/metrics, got {self.dcgm!r}")
        require(not (self.dcgm and self.fake_gpus), "dcgm",
                "dcgm and fake_gpus are two GPU sources: set one")
        require(bool(self.service_name), "service_name", "must not be empty")
        host = self.resolved_host_name()
        ids = [t.resolved_instance_id(host) for t in self.vllm]
        require(len(ids) == len(set(ids)), "vllm",
                f"instance ids must be unique (set instance_id per target): {ids}")
