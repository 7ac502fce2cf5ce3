"""Settings of the provisional live incidents (``[analytics.provisional]``)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetlens.pipeline.schema.bursts import BURST_RATIO
from fleetlens.pipeline.schema.settings import require

#: Severities a provisional incident may page with (those of `incidents`, no "warning":
#: a queue that users wait in is more than a hardware note).
_SEVERITIES = ("minor", "major", "critical")


@dataclass(frozen=True)
class ProvisionalConfig:
    """When the engines' own gauges open a provisional incident, and how long it may wait
    for the span-based (confirmed) incident before it is withdrawn."""

    #: Open provisional incidents at all (live only: ``fleetlens analyze`` and
    #: ``pipeline --follow`` with webhooks; nothing is written to `incidents`).
    enabled: bool = True
    #: A sample breaches when at least this many requests wait (the waiting median of a
    #: healthy engine is 0, so a relative band never fires: an absolute floor),
    min_waiting: float = 4.0
    #: ... and at least this multiple of the running batch wait (a big engine with 200
    #: running absorbs a few arrivals between two steps; 0 turns the ratio off),
    waiting_per_running: float = 0.1
    #: ... or when the KV cache is at least this full with any request waiting (the cache,
    #: not the batch size, holds them back).
    kv_full: float = 0.95
    #: ... or when its decode slowed without a queue: the running batch over the tokens
    #: it generates per second (the engine's TPOT, from its counters, at once) at least this
    #: multiple of its own recent median (0: off). A slower step (engine overhead, a
    #: slower GPU) builds no queue at half load: the batch grows instead. 1.35: +30 ms a
    #: step on the bench's L4s moved it x1.4-1.5, natural bursts up to x1.3.
    decode_ratio: float = 1.35
    #: ... the TPOT over this many samples (one scrape's tokens are noise),
    decode_samples: int = 5
    #: ... against its median over this many samples before them (at least half present).
    decode_baseline_samples: int = 120
    #: Breaching samples in a row for at least this long open an incident, s (samples are
    #: the agent's scrapes, every second; a gap over ``max_gap_s`` ends a run).
    hold_s: float = 5.0
    #: Two samples further apart than this are not "in a row", s (the agent scrapes every
    #: second by default; 15 s also holds a 10 s scrape interval).
    max_gap_s: float = 15.0
    #: The engine's own recent past the cause guess compares with, s (prompt tokens per
    #: second before the queue formed).
    lookback_s: float = 300.0
    #: Prompt tokens computed per second at least this multiple of the look-back's: the
    #: arrivals rose, the guess is ``traffic_surge`` (a queue with no more work is not); by
    #: default a burst as everything else defines it (pipeline.schema.bursts).
    surge_ratio: float = BURST_RATIO
    #: A provisional incident that no latency or failure incident on its scope confirmed
    #: within this many analysis windows after it began is withdrawn (the span-based
    #: incident needs ``consecutive`` windows plus the slow requests' own time to end).
    confirm_within_windows: int = 10
    #: Severity a provisional incident is posted with (the confirmed one brings its own).
    severity: str = "major"

    def validate(self) -> None:
        """Refuse settings that could never open or never withdraw an incident."""
        require(self.min_waiting >= 1, "min_waiting", "must be at least 1 request")
        require(self.waiting_per_running >= 0, "waiting_per_running", "must not be negative")
        require(0 < self.kv_full <= 1, "kv_full", "must be in (0, 1]")
        require(self.hold_s >= 0, "hold_s", "must not be negative")
        require(self.decode_ratio == 0 or self.decode_ratio > 1, "decode_ratio",
                "must be above 1 (or 0: off)")
        require(self.decode_samples >= 2, "decode_samples", "must be at least 2")
        require(self.decode_baseline_samples >= 10, "decode_baseline_samples",
                "must be at least 10")
        require(self.max_gap_s > 0, "max_gap_s", "must be positive")
        require(self.lookback_s > self.hold_s, "lookback_s", "must be longer than hold_s")
        require(self.surge_ratio > 1, "surge_ratio", "must be above 1")
        require(self.confirm_within_windows >= 1, "confirm_within_windows",
                "must be at least 1")
        require(self.severity in _SEVERITIES, "severity",
                f"{self.severity!r} is not one of {', '.join(_SEVERITIES)}")
