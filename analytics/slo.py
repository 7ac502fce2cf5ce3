"""SLO rules: ``"p99(e2e) > 850 ms"``, ``"p99(ttft) > 200 ms for 10 s"``.

A rule names a window percentile column (``e2e_p99_s``), a threshold in seconds and how long
the breach must last. The duration is rounded up to whole windows, at least one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.timegrammar import DURATION_PATTERN, duration_seconds

# Threshold and duration are durations of the one grammar (850ms, 10 s, 2m, ...).
_RULE = re.compile(
    r"^\s*(?P<pct>p\d{2})\s*\(\s*(?P<metric>[a-z0-9]+)\s*\)\s*(?P<op>>=|>)\s*"
    rf"{DURATION_PATTERN}(?:\s+for\s+{DURATION_PATTERN})?\s*$"  # groups 4-5, 6-7
)


@dataclass(frozen=True)
class SloRule:
    """One parsed SLO rule.

    Attributes:
        text: the rule as written (used as the detector name).
        column: the `windows` column it reads, e.g. ``e2e_p99_s``.
        threshold_s: the value above which a window breaks the rule.
        inclusive: ``>=`` instead of ``>``.
        for_s: how long the breach must last (0: one window is enough).
    """

    text: str
    column: str
    threshold_s: float
    inclusive: bool
    for_s: float

    def windows_needed(self, window_s: int) -> int:
        """Consecutive windows that must break the rule at a given window size."""
        return max(1, math.ceil(self.for_s / window_s - 1e-9))


def parse_rule(text: str) -> SloRule:
    """Parse an SLO rule.

    Raises:
        ValueError: naming what is wrong, with the expected form.
    """
    match = _RULE.match(text)
    if not match:
        raise ValueError(
            f"cannot parse SLO rule {text!r}; expected e.g. 'p99(e2e) > 850 ms' or "
            "'p99(ttft) > 200 ms for 10 s'"
        )
    pct, metric = match["pct"], match["metric"]
    try:
        column = c.percentile_column(metric, pct)
    except ValueError as exc:
        raise ValueError(f"SLO rule {text!r}: {exc}") from None
    duration = duration_seconds(match[6], match[7]) if match[6] else 0.0
    return SloRule(
        text=" ".join(text.split()),
        column=column,
        threshold_s=duration_seconds(match[4], match[5]),
        inclusive=match["op"] == ">=",
        for_s=duration,
    )
