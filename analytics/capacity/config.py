"""Settings of the capacity analysis (the ``[analytics.capacity]`` table).

::

    [analytics.capacity]
    tpot_ratio = 1.5        # the knee: TPOT p99 at most 1.5x its batch-1 value ...
    ttft_p99_s = 2.0        # ... and TTFT p99 at most 2 s (a service's own TTFT SLO wins)
    peak_tflops = {h100 = 989.0}   # dense BF16 TFLOP/s per GPU model, over the built-ins

A service with a latency SLO on ``tpot`` or ``ttft`` in ``[analytics.slos]`` is judged by that
threshold instead of these defaults (docs/analytics.md, "Capacity").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetlens.pipeline.schema.settings import require


@dataclass(frozen=True)
class CapacityConfig:
    """Where the knee is, how much data a curve needs, and the hardware figures for MFU."""

    #: Compute the `capacity` table at all.
    enabled: bool = True
    #: The TPOT SLO by default: TPOT p99 at most this multiple of its batch-1 value.
    tpot_ratio: float = 1.5
    #: The TPOT percentile the knee judges: ``p99`` (the SLO's tail) or ``p50`` (the decode
    #: step time itself, which a roofline predicts; the tail also grows with the prefills
    #: that arrivals bring).
    tpot_percentile: str = "p99"
    #: The TTFT SLO by default: TTFT p99 at most this, s.
    ttft_p99_s: float = 2.0
    #: Windows (instance x window) a pool needs before its curve is fitted.
    min_windows: int = 8
    #: An instance-window is a point of the curve only with this many requests (tails of
    #: fewer are noise).
    min_requests: int = 5
    #: Bootstrap resamples of the windows for the knee's interval.
    bootstrap_samples: int = 100
    #: Batch bins (width, in running requests, relative: 0.25 = +-25% of the bin's centre)
    #: used to say which batch ranges the fleet visited.
    bin_rel_width: float = 0.25
    #: The windows of "now": the last this many seconds of data (goodput now, headroom).
    now_s: int = 900
    #: Dense BF16 tensor TFLOP/s per GPU model (substring match, like ``hbm_gbps``); merged
    #: over the built-in figures of :mod:`analytics.hardware`.
    peak_tflops: dict[str, float] = field(default_factory=dict)
    #: The verdict "compute-bound" when MFU is at least this share of MBU (else memory).
    compute_bound_ratio: float = 1.0

    def validate(self) -> None:
        """Refuse settings no knee can be found with."""
        require(self.tpot_ratio > 1, "tpot_ratio", "must be above 1")
        require(self.tpot_percentile in ("p50", "p99"), "tpot_percentile",
                f"{self.tpot_percentile!r} is not p50 or p99")
        require(self.ttft_p99_s > 0, "ttft_p99_s", "must be positive")
        require(self.min_windows >= 3, "min_windows", "must be at least 3 (a line and its error)")
        require(self.min_requests >= 1, "min_requests", "must be at least 1")
        require(self.bootstrap_samples >= 10, "bootstrap_samples", "must be at least 10")
        require(0 < self.bin_rel_width < 1, "bin_rel_width", "must be in (0, 1)")
        require(self.now_s > 0, "now_s", "must be positive")
        require(self.compute_bound_ratio > 0, "compute_bound_ratio", "must be positive")
        for name, value in self.peak_tflops.items():
            require(float(value) > 0, "peak_tflops", f"{name}: must be positive")
