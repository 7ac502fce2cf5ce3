"""The Traces page's own filters, in its URL and as a :class:`TraceQuery`.

``traces?min=e2e_s=2&attr=gen_ai.request.max_tokens>=1024&errors=only&sort=-e2e_s&page=2``;
the time range, services, models, hosts and regions come from the sidebar (its own URL
parameters, :mod:`dashboard.url_state`). The page widgets are seeded from a link once per
session and written back on every run, as the sidebar's are. The search itself runs in
:mod:`analytics.traces.search`; the page only renders what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from fleetlens.analytics.traces.query import (
    TraceQuery,
    merge_bounds,
    parse_attr,
    parse_bound,
    parse_sort,
)
from fleetlens.dashboard.filters import Filters
from fleetlens.pipeline.schema import columns as c

#: Rows per page of the Traces page.
PAGE_SIZE = 50
#: Columns the page offers to sort by (any requests column works in a link).
SORTS = (c.E2E_S, c.TTFT_S, c.TPOT_S, c.QUEUE_S, c.PREFILL_S, c.DECODE_S, c.OVERHEAD_S,
         c.INPUT_TOKENS, c.OUTPUT_TOKENS, c.CACHED_TOKENS, c.ARRIVAL_NS)
DEFAULT_SORT = f"-{c.E2E_S}"
#: The errors selector: label -> URL value -> ``TraceQuery.error``.
ERRORS = {"any": ("", None), "only errors": ("only", True), "no errors": ("none", False)}
#: widget key -> URL parameter (repeated parameters hold one value each)
WIDGETS = {"ts_min": "min", "ts_max": "max", "ts_attr": "attr", "ts_finish": "finish",
           "ts_instance": "instance", "ts_gpu": "gpu", "ts_errors": "errors",
           "ts_sort": "sort", "ts_page": "page"}
_LISTS = ("min", "max", "attr", "finish", "instance", "gpu")
#: comma-separated text widgets (one URL parameter per value)
_COMMAS = (("ts_min", "min"), ("ts_max", "max"), ("ts_finish", "finish"),
           ("ts_instance", "instance"), ("ts_gpu", "gpu"))


def _split(text: str, sep: str) -> list[str]:
    return [part.strip() for part in text.split(sep) if part.strip()]


def seed(state: MutableMapping[str, Any], params: Mapping[str, Sequence[str]]) -> None:
    """Put a link's page filters into the widget ``state`` (keys the session already has
    win). Lists become one line per value (attributes) or comma-separated text."""
    def first(name: str) -> str:
        return next(iter(params.get(name, [])), "")

    values: dict[str, Any] = {key: ", ".join(params.get(name, [])) for key, name in _COMMAS}
    values.update({
        "ts_attr": "\n".join(params.get("attr", [])),
        "ts_errors": next((label for label, (code, _) in ERRORS.items()
                           if code == first("errors")), "any"),
    })
    sort = first("sort") or DEFAULT_SORT
    values["ts_sort"] = sort.lstrip("+-") if sort.lstrip("+-") in SORTS else c.E2E_S
    values["ts_desc"] = sort.startswith("-") or sort.lstrip("+-") not in SORTS
    page = first("page")
    values["ts_page"] = int(page) if page.isdigit() and int(page) >= 1 else 1
    for key, value in values.items():
        state.setdefault(key, value)


def encode(state: Mapping[str, Any]) -> dict[str, str | list[str]]:
    """The page's URL parameters of the widget values (defaults and empty ones left out)."""
    out: dict[str, str | list[str]] = {}
    for key, name in _COMMAS:
        parts = _split(state.get(key) or "", ",")
        if parts:
            out[name] = parts
    attrs = _split(state.get("ts_attr") or "", "\n")
    if attrs:
        out["attr"] = attrs
    code = ERRORS.get(state.get("ts_errors") or "any", ("", None))[0]
    if code:
        out["errors"] = code
    sort = ("-" if state.get("ts_desc", True) else "") + (state.get("ts_sort") or c.E2E_S)
    if sort != DEFAULT_SORT:
        out["sort"] = sort
    page = int(state.get("ts_page") or 1)
    if page > 1:
        out["page"] = str(page)
    return out


def write(query_params: Any, state: Mapping[str, Any]) -> None:  # noqa: ANN401 - st.query_params
    """Replace the page's parameters of ``query_params`` with those of ``state`` (only when
    they changed: every assignment is a browser history update)."""
    wanted = encode(state)
    names = set(WIDGETS.values())
    current = {k: (query_params.get_all(k) if k in _LISTS else query_params[k])
               for k in names if k in query_params}
    if current == wanted:
        return
    for key in names:
        if key in query_params and key not in wanted:
            del query_params[key]
    for key, value in wanted.items():
        query_params[key] = value


def query_of(f: Filters, state: Mapping[str, Any]) -> TraceQuery:
    """The search the sidebar ``f`` and the page widgets ask for.

    Raises:
        SearchError: a filter that does not parse (shown to the user as one line).
    """
    attrs = tuple(parse_attr(text) for text in _split(state.get("ts_attr") or "", "\n"))
    bounds = merge_bounds([parse_bound(v, "min") for v in _split(state.get("ts_min") or "", ",")],
                          [parse_bound(v, "max") for v in _split(state.get("ts_max") or "", ",")])
    column, descending = parse_sort(("-" if state.get("ts_desc", True) else "")
                                    + (state.get("ts_sort") or c.E2E_S))
    page = max(int(state.get("ts_page") or 1), 1)
    return TraceQuery(
        start_ns=f.start_ns, end_ns=f.end_ns, services=f.services, models=f.models,
        hosts=f.hosts, regions=f.regions,
        instances=tuple(_split(state.get("ts_instance") or "", ",")),
        gpus=tuple(_split(state.get("ts_gpu") or "", ",")),
        finish_reasons=tuple(_split(state.get("ts_finish") or "", ",")),
        error=ERRORS.get(state.get("ts_errors") or "any", ("", None))[1],
        bounds=bounds, attrs=attrs, sort=column, descending=descending,
        limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
