"""The whole ``fleetlens.toml``: one section per component, each its own frozen dataclass."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from analytics.config import AnalyticsConfig
from collector.agent.config import AgentConfig
from collector.config import CollectorConfig
from dashboard.config import DashboardConfig
from pipeline.config import PipelineConfig
from pipeline.schema.settings import (
    DEFAULT_CONFIG_FILE,
    DEFAULT_DATA_DIR,
    ENV_CONFIG_FILE,
    build,
    env_overrides,
    merge,
    read_toml,
    require,
)


@dataclass(frozen=True)
class FleetlensConfig:
    """Root of the config tree."""

    data_dir: str = DEFAULT_DATA_DIR
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    analytics: AnalyticsConfig = field(default_factory=AnalyticsConfig)

    def validate(self) -> None:
        require(bool(self.data_dir), "data_dir", "must not be empty")


def resolve_config_file(path: str | os.PathLike[str] | None) -> Path | None:
    """The config file to read: ``path``, else ``$FLEETLENS_CONFIG``, else ``./fleetlens.toml``
    if it exists, else none (defaults only)."""
    if path:
        return Path(path)
    if os.environ.get(ENV_CONFIG_FILE):
        return Path(os.environ[ENV_CONFIG_FILE])
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.exists() else None


def load_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> FleetlensConfig:
    """Load defaults, then the config file, then ``FLEETLENS_*`` environment overrides.

    Raises:
        pipeline.schema.settings.ConfigError: naming the bad field.
    """
    file = resolve_config_file(path)
    data = read_toml(file) if file else {}
    data = merge(data, env_overrides(environ))
    return build(FleetlensConfig, data)
