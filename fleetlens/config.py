"""The whole ``fleetlens.toml``: one section per component, each its own frozen dataclass."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.collector.agent.config import AgentConfig
from fleetlens.collector.config import CollectorConfig
from fleetlens.dashboard.config import DashboardConfig
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.schema.settings import (
    DEFAULT_DATA_DIR,
    build,
    config_file,
    read_config,
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
    return config_file(path)


def load_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> FleetlensConfig:
    """Load defaults, then the config file, then ``FLEETLENS_*`` environment overrides.

    Raises:
        pipeline.schema.settings.ConfigError: naming the bad field.
    """
    return build(FleetlensConfig, read_config(path, environ))
