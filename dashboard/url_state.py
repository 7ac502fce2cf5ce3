"""The sidebar's filters and time range in the page URL, so a link shows what its sender saw.

``?range=6h&service=chat&host=h01&host=h02`` or ``?range=custom&from=2026-12-01T10:00Z&
to=2026-12-01T11:30Z``. A link opened in a new session seeds the sidebar widgets; every run
then writes the widgets' values back (page parameters such as ``id`` are left alone).
Unknown values in a link are dropped, never an error: the link may be older than the data.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

#: Range label (as the sidebar shows it) -> its value in the URL.
RANGE_CODES = {"Last 15 min": "15m", "Last 1 h": "1h", "Last 6 h": "6h", "Last 24 h": "24h",
               "Last 7 d": "7d", "All data": "all", "Custom": "custom"}
#: Sidebar multiselect key suffix -> URL parameter (one repeated parameter per value).
LIST_PARAMS = {"services": "service", "models": "model", "hosts": "host", "regions": "region"}
TIME_FORMAT = "%Y-%m-%dT%H:%MZ"
FILTER_PARAMS = ("range", "from", "to", *LIST_PARAMS.values())


def format_time(moment: dt.datetime) -> str:
    """A UTC minute as the URL carries it (``2026-12-01T10:00Z``)."""
    return moment.astimezone(dt.UTC).strftime(TIME_FORMAT)


def parse_time(text: str) -> dt.datetime | None:
    """The inverse of :func:`format_time`; ``None`` for anything else."""
    try:
        return dt.datetime.strptime(text, TIME_FORMAT).replace(tzinfo=dt.UTC)
    except (TypeError, ValueError):
        return None


def seed(state: MutableMapping[str, Any], params: Mapping[str, Sequence[str]],
         options: Mapping[str, Sequence[str]], bounds: tuple[dt.datetime, dt.datetime] | None
         ) -> None:
    """Put the link's filters into the widget state ``state`` (keys ``f_range``,
    ``f_custom``, ``f_services``...), keeping only values the data offers.

    Args:
        state: ``st.session_state``; keys already set (the session's own picks) win.
        params: every URL parameter's values (``{name: [values]}``).
        options: what each multiselect offers, by key suffix (``services``...).
        bounds: first and last moment of the data, for a custom range.
    """
    labels = {code: label for label, code in RANGE_CODES.items()}
    code = next(iter(params.get("range", [])), None)
    if "f_range" not in state and code in labels:
        state["f_range"] = labels[code]
        if code == "custom" and bounds is not None:
            lo, hi = bounds
            start = parse_time(next(iter(params.get("from", [])), "")) or lo
            end = parse_time(next(iter(params.get("to", [])), "")) or hi
            start, end = max(lo, min(start, hi)), max(lo, min(end, hi))
            state["f_custom"] = (min(start, end), max(start, end))
    for name, param in LIST_PARAMS.items():
        key = f"f_{name}"
        wanted = [v for v in params.get(param, []) if v in options.get(name, ())]
        if key not in state and wanted:
            state[key] = list(dict.fromkeys(wanted))


def encode(state: Mapping[str, Any]) -> dict[str, str | list[str]]:
    """The URL parameters of the current widget values (empty filters left out)."""
    out: dict[str, str | list[str]] = {}
    label = state.get("f_range")
    if label in RANGE_CODES:
        out["range"] = RANGE_CODES[label]
        custom = state.get("f_custom")
        if label == "Custom" and custom:
            out["from"], out["to"] = format_time(custom[0]), format_time(custom[1])
    for name, param in LIST_PARAMS.items():
        values = list(state.get(f"f_{name}") or ())
        if values:
            out[param] = values
    return out


def write(query_params: Any, state: Mapping[str, Any]) -> None:  # noqa: ANN401 - st.query_params
    """Replace the filter parameters of ``query_params`` with those of ``state`` (only when
    they changed: every assignment is a browser history update)."""
    wanted = encode(state)
    current = {k: (query_params.get_all(k) if k in LIST_PARAMS.values() else query_params[k])
               for k in FILTER_PARAMS if k in query_params}
    if current == wanted:
        return
    for key in FILTER_PARAMS:
        if key in query_params and key not in wanted:
            del query_params[key]
    for key, value in wanted.items():
        query_params[key] = value
