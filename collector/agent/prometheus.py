"""Prometheus text exposition (what vLLM's and dcgm-exporter's ``/metrics`` serve), read with
``prometheus_client``'s own parser.

Only samples are needed: ``name{label="value",...} value [timestamp]``, with the escapes,
``+Inf``/``NaN`` and the Prometheus 3 quoted names (``{"name.with.dots", label="v"}``) the
reference parser knows. A malformed text raises :class:`ExpositionError` naming the first
bad line.
"""

from __future__ import annotations

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


def _families(text: str) -> list[Sample]:
    return [Sample(s.name, dict(s.labels), float(s.value))
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
