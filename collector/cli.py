"""``fleetlens collector``: run the OTLP collector."""

from __future__ import annotations

import logging
import os
from typing import Any

import click

from fleetlens.collector.config import CollectorConfig
from fleetlens.pipeline.schema.logsetup import configure_logging
from fleetlens.pipeline.schema.settings import (
    DATA_DIR_HELP,
    DEFAULT_DATA_DIR,
    ENV_DATA_DIR,
    ConfigError,
    load_section,
    read_config,
)

SECTION = "collector"


def load(config_file: str | None, overrides: dict[str, Any]) -> tuple[CollectorConfig, str | None]:
    """The ``[collector]`` config (file, then ``FLEETLENS_COLLECTOR__*``, then ``overrides``)
    and the file's ``data_dir`` if it sets one.

    Raises:
        ConfigError: naming the bad field.
    """
    config = load_section(CollectorConfig, SECTION, config_file, overrides=overrides)
    return config, read_config(config_file).get("data_dir")


@click.command()
@click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
              help=DATA_DIR_HELP)
@click.option("--wal-dir", "wal_dir", type=click.Path(file_okay=False), default=None,
              help="Write-ahead log folder on a local disk, for an s3:// --data-dir "
                   "[config: wal_dir; else $FLEETLENS_WAL_DIR; DATA_DIR/wal for a local one].")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="fleetlens.toml [default: $FLEETLENS_CONFIG or ./fleetlens.toml].")
@click.option("--grpc-address", default=None, help="OTLP/gRPC HOST:PORT [127.0.0.1:4317].")
@click.option("--http-address", default=None, help="OTLP/HTTP HOST:PORT [127.0.0.1:4318].")
@click.option("--workers", type=int, default=None,
              help="Worker processes sharing the ports (0: one per core) [config: 0].")
@click.option("--self-metrics-address", default=None,
              help='The collector\'s own metrics HOST:PORT, no token ("" turns them off) '
                   "[127.0.0.1:8888].")
@click.option("--forward", "forward", default=None, metavar="HOST:PORT",
              help="Edge mode: forward every acknowledged Export to this central collector "
                   "(OTLP/gRPC, TLS) instead of writing Parquet here.")
@click.option("--forward-ca", default=None, type=click.Path(dir_okay=False),
              help="CA file that signed the central collector's certificate [system roots].")
@click.option("--forward-cert", default=None, type=click.Path(dir_okay=False),
              help="Client certificate for mutual TLS with the central collector.")
@click.option("--forward-key", default=None, type=click.Path(dir_okay=False),
              help="Key of --forward-cert.")
@click.option("--forward-token", default=None,
              help="Bearer token for the central collector (prefer "
                   "FLEETLENS_COLLECTOR__FORWARD__AUTH_TOKEN: options show in ps).")
@click.option("--forward-insecure", is_flag=True, default=None,
              help="Forward in plaintext (no TLS): only on a trusted network.")
def collector(data_dir: str | None, wal_dir: str | None, config_file: str | None,
              grpc_address: str | None, http_address: str | None, workers: int | None,
              self_metrics_address: str | None, forward: str | None, forward_ca: str | None,
              forward_cert: str | None, forward_key: str | None, forward_token: str | None,
              forward_insecure: bool | None) -> None:
    """Receive OTLP traces, metrics and logs and store them as raw Parquet.

    Every Export is written to a write-ahead log and fsynced before it is acknowledged;
    rows are published as Parquet segments under DATA_DIR/raw/. SIGTERM drains and flushes.
    With --forward (an edge collector) the WAL is forwarded to a central collector instead.
    """
    from fleetlens.collector.supervisor import run

    forwarding = {"address": forward, "ca_file": forward_ca, "cert_file": forward_cert,
                  "key_file": forward_key, "auth_token": forward_token,
                  "insecure": forward_insecure}
    overrides: dict[str, Any] = {
        "grpc_address": grpc_address, "http_address": http_address, "workers": workers,
        "self_metrics_address": self_metrics_address, "wal_dir": wal_dir,
        "forward": {k: v for k, v in forwarding.items() if v is not None} or None}
    try:
        config, file_data_dir = load(config_file, overrides)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None
    root = data_dir or os.environ.get(ENV_DATA_DIR) or file_data_dir or DEFAULT_DATA_DIR
    configure_logging(logging.INFO)
    try:
        run(config, root)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
