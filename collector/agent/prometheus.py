"""A small parser for the Prometheus text exposition format (what vLLM's ``/metrics`` serves).

Only samples are needed: ``name{label="value",...} value [timestamp]``. ``# HELP`` and
``# TYPE`` lines are skipped. Label values may contain escaped quotes, backslashes and
newlines. A malformed line raises :class:`ExpositionError` naming the line number.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_CLOSE = re.compile(r"\s*\}")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_SPECIAL = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


class ExpositionError(ValueError):
    """The text is not valid Prometheus exposition format."""


@dataclass(frozen=True)
class Sample:
    """One exposition line."""

    name: str
    labels: dict[str, str]
    value: float


def _unescape(value: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], value)


def _parse_value(text: str, lineno: int) -> float:
    token = text.split()[0] if text.split() else ""
    if token in _SPECIAL:
        return _SPECIAL[token]
    try:
        return float(token)
    except ValueError:
        raise ExpositionError(f"line {lineno}: bad sample value {token!r}") from None


def parse_samples(text: str) -> list[Sample]:
    """Every sample in ``text``, in order."""
    samples = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        if not match:
            raise ExpositionError(f"line {lineno}: no metric name in {raw[:80]!r}")
        name, pos, labels = match.group(0), match.end(), {}
        if pos < len(line) and line[pos] == "{":
            pos += 1
            while True:
                closing = _CLOSE.match(line, pos)  # "}" (also after a trailing comma)
                if closing:
                    pos = closing.end()
                    break
                label = _LABEL.match(line, pos)
                if not label:
                    raise ExpositionError(f"line {lineno}: bad labels in {raw[:80]!r}")
                labels[label.group(1)] = _unescape(label.group(2))
                pos = label.end()
                if label.group(3) == "}":
                    break
        samples.append(Sample(name, labels, _parse_value(line[pos:], lineno)))
    return samples
