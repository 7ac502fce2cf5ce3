"""Pipeline configuration (the ``[pipeline]`` table of ``fleetlens.toml``)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.schema.settings import require


@dataclass(frozen=True)
class PipelineConfig:
    """Window sizes, lateness, retention and the dimensions copied onto requests."""

    window_s: int = 60
    #: Data this late (by event time) still updates the windows it belongs to.
    lateness_s: int = 300
    #: Seconds between runs in ``--follow`` mode.
    follow_interval_s: float = 10.0
    raw_retention_days: int = 7
    windows_retention_days: int = 90
    #: Resource or span attribute keys copied onto `requests` as dimension columns,
    #: as "column=attribute.key" or just "attribute.key" (dots become underscores).
    dimensions: tuple[str, ...] = ("region", "device_type", "gpu_model", "lora")

    def validate(self) -> None:
        require(self.window_s > 0, "window_s", "must be positive")
        require(self.lateness_s >= 0, "lateness_s", "must not be negative")
        require(self.follow_interval_s > 0, "follow_interval_s", "must be positive")
        require(self.raw_retention_days > 0, "raw_retention_days", "must be positive")
        require(self.windows_retention_days > 0, "windows_retention_days", "must be positive")
