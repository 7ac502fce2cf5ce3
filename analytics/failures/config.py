"""Settings of the failure detectors (:mod:`analytics.failures`)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetlens.pipeline.schema.settings import require


@dataclass(frozen=True)
class FailureConfig:
    """When an absence, a stall, a restart, failing requests or a hot GPU become an incident."""

    #: Run the failure detectors at all.
    enabled: bool = True
    #: An engine is down once every scrape of it failed (``up`` = 0) for this long, s.
    down_after_s: float = 10.0
    #: An engine whose every scrape failed since the agent first scraped it is starting (a
    #: vLLM loads its model for 30-90 s, a 70B from remote storage for minutes), until this
    #: long: then it never came up (a wrong URL, a crash at start), s.
    never_up_after_s: float = 600.0
    #: An engine hangs once it has running requests and computed no new token for this long
    #: while its ``/metrics`` still answers, s.
    hang_after_s: float = 30.0
    #: A host's agent silent for this long while other hosts report is a lost host (nothing
    #: arrives from it) or a telemetry gap (its spans still arrive), s. 40 s: a lost host is
    #: posted within a minute of its onset (bench/detect_delay.py measured 65-71 s at 60 s),
    #: and it is four of the agent's 10 s exports, not one late batch.
    silent_after_s: float = 40.0
    #: A window of failing requests: at least this many failed, and this share of its requests.
    error_min_count: int = 5
    error_min_rate: float = 0.05
    #: How long a configuration change is the first suspect: a latency incident on its engines
    #: (or service) that starts within this long after it names it as its first cause, s.
    #: Other failures are suspects while they last and two windows after.
    aftermath_s: float = 300.0
    #: A GPU whose thermal clock-event reasons (NVML/DCGM SW or HW thermal slowdown, HW
    #: slowdown) stayed set for this long is a hardware warning, whatever the latency did, s.
    #: One hot sample is the driver doing its job; a minute of them is cooling that cannot
    #: keep up (a failed fan, a hot aisle) and a slowdown waiting for load. The power cap
    #: (0x4), set at full load on a healthy GPU, never counts.
    throttle_after_s: float = 60.0

    def validate(self) -> None:
        """Refuse settings no detector can work with."""
        for name in ("down_after_s", "never_up_after_s", "hang_after_s", "silent_after_s",
                     "aftermath_s", "throttle_after_s"):
            require(getattr(self, name) > 0, name, "must be positive")
        require(self.error_min_count >= 1, "error_min_count", "must be at least 1")
        require(0 < self.error_min_rate <= 1, "error_min_rate", "must be in (0, 1]")
