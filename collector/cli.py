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
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="fleetlens.toml [default: $FLEETLENS_CONFIG or ./fleetlens.toml].")
@click.option("--grpc-address", default=None, help="OTLP/gRPC HOST:PORT [127.0.0.1:4317].")
@click.option("--http-address", default=None, help="OTLP/HTTP HOST:PORT [127.0.0.1:4318].")
@click.option("--workers", type=int, default=None,
              help="Worker processes sharing the ports (0: one per core) [config: 0].")
def collector(data_dir: str | None, config_file: str | None, grpc_address: str | None,
              http_address: str | None, workers: int | None) -> None:
    """Receive OTLP traces, metrics and logs and store them as raw Parquet.

    Every Export is written to a write-ahead log and fsynced before it is acknowledged;
    rows are published as Parquet segments under DATA_DIR/raw/. SIGTERM drains and flushes.
    """
    from fleetlens.collector.supervisor import run

    overrides = {"grpc_address": grpc_address, "http_address": http_address, "workers": workers}
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
