"""The one grammar for durations and points in time, used by every command, the scenario
files and the SLO rules (so ``2h``, ``850ms`` and ``now-2h`` mean the same everywhere).

Durations: a number and a unit, e.g. ``850ms``, ``1.5 s``, ``30m``, ``2h``, ``7d``
(units ``ns us µs ms s sec m min h d w``).

Times: ``now``; ``now-2h`` / ``now+5m``; a bare duration such as ``2h``, meaning that long
ago (what ``--since 2h`` says); an ISO-8601 time (UTC unless it names a zone, ``Z`` allowed);
or a Unix time in seconds, milliseconds, microseconds or nanoseconds, told apart by size (a
date in the years 1973-5138 needs that many digits).
"""

from __future__ import annotations

import datetime as dt
import re
import time

NS = 1_000_000_000
#: unit -> seconds
DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
    "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0,
}
#: a regular-expression piece matching one duration: groups (number, unit)
DURATION_PATTERN = r"(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|sec|min|s|m|h|d|w)"
_DURATION = re.compile(rf"^{DURATION_PATTERN}$")
_RELATIVE = re.compile(rf"^now\s*(?:([-+])\s*{DURATION_PATTERN})?$")
TIME_EXAMPLES = "now, now-2h, 2h (ago), 2026-01-01T10:00Z or a Unix time"


def duration_seconds(number: str, unit: str) -> float:
    """Seconds of one matched (number, unit) pair of :data:`DURATION_PATTERN`."""
    return float(number) * DURATION_UNITS[unit]


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (e.g. ``850ms`` -> 0.85).

    Raises:
        ValueError: naming the text and the expected form.
    """
    match = _DURATION.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration; use e.g. 850ms, 30s, 15m, 2h or 7d")
    return duration_seconds(match[1], match[2])


def parse_time(text: str, now_ns: int | None = None) -> int:
    """Nanoseconds since the epoch of ``text`` (see the module docstring for the forms).

    Raises:
        ValueError: naming the text and the accepted forms.
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    value = str(text).strip()
    relative = _RELATIVE.match(value)
    if relative:
        if not relative[1]:
            return now_ns
        offset = int(duration_seconds(relative[2], relative[3]) * NS)
        return now_ns - offset if relative[1] == "-" else now_ns + offset
    ago = _DURATION.match(value)
    if ago:
        return now_ns - int(duration_seconds(ago[1], ago[2]) * NS)
    if value.isdigit():
        number = int(value)
        for scale in (NS, 10**6, 10**3):  # seconds, ms, µs since the epoch
            if number < 10**11 * NS // scale:
                return number * scale
        return number
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time; use {TIME_EXAMPLES}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp()) * NS + moment.microsecond * 1000
