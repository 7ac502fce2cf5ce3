"""Pipeline configuration (the ``[pipeline]`` table of ``fleetlens.toml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetlens.pipeline.schema.settings import require


@dataclass(frozen=True)
class PipelineConfig:
    """Window sizes, lateness, retention and the dimensions copied onto requests."""

    window_s: int = 60
    #: Data this late (by event time) still updates the windows it belongs to.
    lateness_s: int = 300
    #: A row moves its host's watermark at most this far past its receive time (match the
    #: collector's ``max_future_skew_s``): one row dated days ahead cannot make every later
    #: row of its host "too late".
    max_future_skew_s: int = 300
    #: Seconds between runs in ``--follow`` mode.
    follow_interval_s: float = 10.0
    raw_retention_days: int = 7
    windows_retention_days: int = 90
    #: Resource or span attribute keys copied onto `requests` as dimension columns,
    #: as "column=attribute.key" or just "attribute.key" (dots become underscores).
    dimensions: tuple[str, ...] = ("region", "device_type", "gpu_model", "lora")
    #: Energy is apportioned in slots of this length (must divide window_s): shorter slots
    #: separate idle from busy time more finely and cost more rows.
    energy_slot_s: int = 10
    #: Longest request the energy stage looks back for (a request is active until it ends).
    max_request_s: int = 3600
    #: Largest gap between two samples of one GPU that is still interpolated across.
    max_sample_gap_s: float = 60.0
    #: Length of one `gpu_samples` row (s): each row sums up a GPU's points in one interval
    #: (agents sample at 10 Hz; energy is always computed from the native points).
    gpu_sample_interval_s: float = 1.0
    #: Raw segments smaller than this are merged into one file per hour by `fleetlens compact`.
    compact_below_bytes: int = 32 * 1024 * 1024
    #: Raw hours younger than this are left alone by compaction (writers may still add to them).
    compact_min_age_s: int = 3600
    #: Both phases of an hour are cut into (host group x hour) shards of about this many raw
    #: rows (spans and metric points; a phase-1 task peaks at about 165 bytes per row,
    #: bench/scale.py --memory): below it, one shard.
    shard_rows: int = 8_000_000
    #: Hosts per shard, overriding the size chosen from the data (0: from ``shard_rows``).
    hosts_per_shard: int = 0
    #: Shards from which phase 1 of an hour reads its raw segments once and splits them into
    #: the shards' rows (pipeline/shardsplit.py); below it each shard reads every segment
    #: itself. The split costs about 300-420 ns per raw row, a shard's own read about 60: it
    #: pays from about 6 shards (bench/scale.py --memory: 1.07-1.09x the CPU at 3 shards,
    #: 0.57-0.80x at 12, two sittings).
    split_from_shards: int = 6
    #: Rows the reduce of an hour in several shards holds at once (pipeline/rangemerge.py):
    #: the shards write their ``request_energy`` rows and request latencies to files, and the
    #: reduce merges about this many rows (latencies: requests) at a time, so its memory does
    #: not grow with the fleet. Any value gives the same bytes.
    reduce_rows: int = 131_072

    def validate(self) -> None:
        require(self.window_s > 0, "window_s", "must be positive")
        require(self.lateness_s >= 0, "lateness_s", "must not be negative")
        require(self.max_future_skew_s >= 0, "max_future_skew_s", "must not be negative")
        require(self.follow_interval_s > 0, "follow_interval_s", "must be positive")
        require(self.raw_retention_days > 0, "raw_retention_days", "must be positive")
        require(self.windows_retention_days > 0, "windows_retention_days", "must be positive")
        require(self.energy_slot_s > 0, "energy_slot_s", "must be positive")
        require(3600 % self.window_s == 0, "window_s", "must divide one hour (10, 60, 300, ...)")
        require(self.window_s % self.energy_slot_s == 0 or self.window_s < self.energy_slot_s,
                "energy_slot_s", f"must divide window_s ({self.window_s})")
        require(self.shard_rows > 0, "shard_rows", "must be positive")
        require(self.hosts_per_shard >= 0, "hosts_per_shard", "must not be negative")
        require(self.split_from_shards >= 2, "split_from_shards", "must be at least 2")
        require(self.reduce_rows > 0, "reduce_rows", "must be positive")
        require(self.max_request_s > 0, "max_request_s", "must be positive")
        require(self.max_sample_gap_s > 0, "max_sample_gap_s", "must be positive")
        step_ns = round(self.gpu_sample_interval_s * 1e9)
        require(step_ns > 0 and 3600 * 10**9 % step_ns == 0, "gpu_sample_interval_s",
                "must be positive and divide one hour (0.1, 1, 10, 60, ...)")
        for spec in self.dimensions:
            column, _, key = spec.partition("=")
            require(bool(column.strip()) and (not _ or bool(key.strip())), "dimensions",
                    f"bad entry {spec!r}: use 'column=attribute.key' or 'attribute.key'")

    @property
    def slot_s(self) -> int:
        """The energy slot length actually used (never longer than a window)."""
        return min(self.energy_slot_s, self.window_s)

    def dimension_map(self) -> dict[str, str]:
        """Dimension columns of `requests`: column name -> attribute key."""
        out = {}
        for spec in self.dimensions:
            column, _, key = spec.partition("=")
            key = key.strip() or column.strip()
            out[(column.strip() if _ else key).replace(".", "_")] = key
        return out
