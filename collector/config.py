"""Collector configuration (the ``[collector]`` table of ``fleetlens.toml``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetlens.pipeline.schema.settings import require

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class TlsConfig:
    """TLS for both listeners; ``client_ca_file`` turns on mutual TLS."""

    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    #: For ``fleetlens health collector``, which reads this same table: the CA that signed
    #: ``cert_file`` (default: ``cert_file`` itself, right for a self-signed certificate or
    #: a file that ends with its CA's certificate) ...
    ca_file: str | None = None
    #: ... and a name ``cert_file`` is issued for, checked instead of the host the probe
    #: dials (127.0.0.1 for a collector listening on every interface).
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    def validate(self) -> None:
        require(
            (self.cert_file is None) == (self.key_file is None),
            "cert_file", "cert_file and key_file must be set together",
        )
        require(
            self.client_ca_file is None or self.cert_file is not None,
            "client_ca_file", "mutual TLS needs cert_file and key_file too",
        )
        require(self.ca_file is None or self.cert_file is not None, "ca_file",
                "ca_file is the CA of cert_file: set cert_file and key_file too")


@dataclass(frozen=True)
class ForwardConfig:
    """Edge mode: forward every acknowledged Export to a central collector over OTLP/gRPC.

    ``address`` empty means a normal (central) collector that publishes Parquet itself.
    """

    address: str = ""
    #: Bearer token the central collector expects (``FLEETLENS_COLLECTOR__FORWARD__AUTH_TOKEN``
    #: keeps it off the command line).
    auth_token: str | None = None
    #: TLS: the CA that signed the central collector's certificate (None: the system roots),
    #: and a client certificate for mutual TLS.
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: Plaintext gRPC; only allowed when set explicitly (data and token travel unencrypted).
    insecure: bool = False
    #: WAL bytes not yet forwarded, over all workers, above which Exports are refused
    #: (UNAVAILABLE + RetryInfo) until the central collector takes some.
    max_pending_bytes: int = 1024 * 1024 * 1024
    #: Largest forwarded request (several acknowledged Exports of one signal are merged).
    max_batch_bytes: int = 4 * 1024 * 1024
    #: Seconds one forwarded Export may take before it is retried.
    timeout_s: float = 30.0
    #: gRPC compression of forwarded requests: "gzip" (the OTLP exporters' default; the link
    #: to the central collector is often the scarce part) or "none".
    compression: str = "gzip"
    #: Permanent refusals in a row after which the central collector is deemed unhealthy
    #: (forwarding stops, nothing more is quarantined) rather than the data bad.
    max_refused_in_a_row: int = 5

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def validate(self) -> None:
        if not self.address:
            return
        host, sep, port = self.address.rpartition(":")
        require(bool(sep and host and port.isdigit() and 0 < int(port) < 65536),
                "address", f"expected HOST:PORT, got {self.address!r}")
        require((self.cert_file is None) == (self.key_file is None),
                "cert_file", "cert_file and key_file must be set together")
        require(not (self.insecure and (self.ca_file or self.cert_file)), "insecure",
                "insecure (plaintext) cannot be combined with ca_file/cert_file")
        require(self.auth_token is None or bool(self.auth_token.strip()), "auth_token",
                "must not be empty")
        require(self.max_pending_bytes > 0, "max_pending_bytes", "must be positive")
        require(self.max_batch_bytes > 0, "max_batch_bytes", "must be positive")
        require(self.timeout_s > 0, "timeout_s", "must be positive")
        require(self.max_refused_in_a_row >= 1, "max_refused_in_a_row", "must be at least 1")
        require(self.compression in ("gzip", "none"), "compression",
                f"expected \"gzip\" or \"none\", got {self.compression!r}")

    def check_files(self) -> None:
        """Fail early, in one line, on a TLS file the workers could not read.

        Raises:
            RuntimeError: naming the setting and the file.
        """
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is None:
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise RuntimeError(f"cannot read forward.{name} {path}: "
                                   f"{exc.strerror or exc}") from None


@dataclass(frozen=True)
class CollectorConfig:
    """Where the collector listens and how much it holds before it refuses."""

    grpc_address: str = f"{LOOPBACK}:4317"
    http_address: str = f"{LOOPBACK}:4318"
    #: Bearer tokens accepted; empty means no authentication (fine on loopback only).
    auth_tokens: tuple[str, ...] = ()
    tls: TlsConfig = field(default_factory=TlsConfig)
    #: Largest request accepted after decompression. 16 MiB, not the OTLP spec's suggested
    #: 64: a worker may hold several at once (issue 33 saw 10 x 60 MiB take 600 MiB), and an
    #: SDK's batch of 512 spans is well under 1 MiB (the OpenTelemetry Collector's gRPC
    #: default is 4 MiB).
    max_request_bytes: int = 16 * 1024 * 1024
    #: Rows buffered before a Parquet segment is published, and its maximum age.
    flush_rows: int = 25_000
    flush_interval_s: float = 5.0
    #: Memory bound (per worker) for buffered, not yet published rows; above it Exports are
    #: refused with UNAVAILABLE + RetryInfo.
    max_buffered_bytes: int = 96 * 1024 * 1024
    #: Accepted age of timestamps (how far before the receive time).
    max_clock_skew_s: float = 7 * 24 * 3600.0
    #: Accepted distance of timestamps ahead of the receive time: small, because the
    #: pipeline's per-host watermark follows the newest event time, and one row dated days
    #: ahead would make every genuine row of that host "too late".
    max_future_skew_s: float = 300.0
    max_attributes: int = 128
    max_attribute_value_bytes: int = 8192
    #: Longest attribute key kept (longer keys are cut); at least 128, the longest key the
    #: span decoder's byte-level fast path reads.
    max_attribute_key_bytes: int = 256
    #: Elements kept per array attribute value.
    max_attribute_list_items: int = 1024
    #: Longest trace_state, scope name/version, schema URL, unit or severity text kept.
    max_name_bytes: int = 1024
    #: Largest resource (or scope) attribute JSON kept per resource: it is repeated on every
    #: row, so attributes past it are dropped (and counted as truncated values).
    max_resource_bytes: int = 16 * 1024
    #: Distinct service/host names per window before new ones go to an overflow bucket.
    max_names_per_window: int = 10_000
    #: New names one request, and one gRPC connection per window, may add to that budget.
    max_new_names_per_request: int = 100
    max_new_names_per_connection: int = 1000
    #: Worker processes sharing the gRPC port (SO_REUSEPORT); 0 means one per core.
    workers: int = 0
    #: With several workers, a worker hands an Export to another that runs fewer at that
    #: moment (collector/balance.py), so every core decodes however few connections there
    #: are (the kernel pins each connection to one worker).
    balance_exports: bool = True
    #: OTLP/HTTP: seconds from a request's first byte to its last (a trickling client is
    #: dropped), seconds a kept-alive connection may sit idle, open connections per worker
    #: (more are answered 503), and threads running Exports per worker.
    http_request_timeout_s: float = 30.0
    http_idle_timeout_s: float = 60.0
    http_max_connections: int = 256
    http_threads: int = 8
    #: OTLP/HTTP: request body bytes one worker holds at once (being read or exported); a
    #: body that would pass it is answered 503 + Retry-After. At least ``max_request_bytes``.
    http_body_budget_bytes: int = 128 * 1024 * 1024
    #: The collector's own metrics (Prometheus text: otelcol_* names, process_* of the
    #: supervisor and all workers) on their own port, without the ingest token; "" turns
    #: it off. 8888 is the OpenTelemetry Collector's own default.
    self_metrics_address: str = f"{LOOPBACK}:8888"
    #: Edge mode (``--forward``): see :class:`ForwardConfig`.
    forward: ForwardConfig = field(default_factory=ForwardConfig)
    #: Write-ahead log folder, on a local disk ("": ``<data_dir>/wal``; for an ``s3://``
    #: data dir ``$FLEETLENS_WAL_DIR``, else ``./fleetlens-wal/<bucket>/<prefix>``).
    wal_dir: str = ""

    def validate(self) -> None:
        for name in ("grpc_address", "http_address"):
            host, sep, port = getattr(self, name).rpartition(":")
            require(bool(sep and host and port.isdigit() and 0 <= int(port) < 65536),
                    name, f"expected HOST:PORT, got {getattr(self, name)!r}")
        require(self.max_request_bytes > 0, "max_request_bytes", "must be positive")
        require(self.flush_rows > 0, "flush_rows", "must be positive")
        require(self.flush_interval_s > 0, "flush_interval_s", "must be positive")
        require(self.max_buffered_bytes > 0, "max_buffered_bytes", "must be positive")
        require(self.max_clock_skew_s > 0, "max_clock_skew_s", "must be positive")
        require(self.max_future_skew_s > 0, "max_future_skew_s", "must be positive")
        require(self.max_attribute_key_bytes >= 128, "max_attribute_key_bytes",
                "must be at least 128")
        for name in ("max_attribute_list_items", "max_name_bytes", "max_resource_bytes",
                     "max_names_per_window", "max_new_names_per_request",
                     "max_new_names_per_connection"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.max_attributes > 0, "max_attributes", "must be positive")
        require(self.max_attribute_value_bytes > 0, "max_attribute_value_bytes", "must be positive")
        require(self.workers >= 0, "workers", "must be 0 (one per core) or more")
        require(not self.wal_dir.startswith("s3://"), "wal_dir",
                "must be a local folder: the WAL is fsynced before each acknowledgement")
        for name in ("http_request_timeout_s", "http_idle_timeout_s", "http_max_connections",
                     "http_threads"):
            require(getattr(self, name) > 0, name, "must be positive")
        # Smaller, a request of the largest size would be answered "retry" forever.
        require(self.http_body_budget_bytes >= self.max_request_bytes,
                "http_body_budget_bytes", f"must be at least max_request_bytes "
                f"({self.max_request_bytes})")
        require(all(self.auth_tokens), "auth_tokens", "tokens must not be empty strings")
        if self.self_metrics_address:
            host, sep, port = self.self_metrics_address.rpartition(":")
            require(bool(sep and host and port.isdigit() and 0 <= int(port) < 65536),
                    "self_metrics_address",
                    f"expected HOST:PORT or \"\" (off), got {self.self_metrics_address!r}")
