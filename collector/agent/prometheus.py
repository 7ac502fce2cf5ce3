"""Prometheus text exposition (what vLLM's and dcgm-exporter's ``/metrics`` serve), read with
``prometheus_client``'s own parser.

Only samples are needed: ``name{label="value",...} value [timestamp]``, with the escapes,
``+Inf``/``NaN`` and the Prometheus 3 quoted names (``{"name.with.dots", label="v"}``) the
reference parser knows. A malformed text raises :class:`ExpositionError` naming the first
bad line.

Sample names are kept as written: the parser appends ``_total`` to every sample of a counter
whose ``# TYPE`` name lacks it (its OpenMetrics munging), e.g. dcgm-exporter's
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``; that suffix is taken off again here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


class ExpositionError(ValueError):
    """The text is not valid Prometheus exposition format."""


@dataclass(frozen=True)
class Sample:
    """One exposition line."""

    name: str
    labels: dict[str, str]
    value: float


_COUNTER_TYPE = re.compile(r'^#\s*TYPE\s+"?([^"\s]+)"?\s+counter\s*$', re.MULTILINE)
_SUFFIX = "_total"


def _families(text: str) -> list[Sample]:
    # Counters declared without "_total": the parser renamed their samples (see above).
    munged = {name for name in _COUNTER_TYPE.findall(text) if not name.endswith(_SUFFIX)}
    return [Sample(s.name.removesuffix(_SUFFIX) if family.type == "counter"
                   and family.name in munged else s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def _first_bad_line(text: str) -> tuple[int, str]:
    """The first line the parser refuses on its own (1-based), for the error message."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            _families(line + "\n")
        except ValueError:
            return lineno, line
    return 0, ""


def parse_samples(text: str) -> list[Sample]:
    """Every sample in ``text``, in order.

    Raises:
        ExpositionError: the text is not valid exposition format (the message names the line).
    """
    try:
        return _families(text)
    except ValueError as exc:  # the parser says what, not where: find the line only now
        lineno, line = _first_bad_line(text)
        where = f"line {lineno}: {line[:80]!r}: " if lineno else ""
        raise ExpositionError(f"{where}{exc or 'malformed exposition text'}") from None
