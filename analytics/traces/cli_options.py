"""The search filters of ``fleetlens traces`` as click options, shared by the search and
``fleetlens traces compare`` (one set of flags, one parser): :func:`filter_options` and
:func:`query_of`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from fleetlens.analytics.cli import parse_since
from fleetlens.analytics.traces.query import (
    SearchError,
    TraceQuery,
    merge_bounds,
    parse_attr,
    parse_bound,
)
from fleetlens.pipeline.schema import columns as c

F = TypeVar("F", bound=Callable[..., Any])
#: The parameter names :func:`filter_options` adds (what :func:`query_of` takes).
FILTER_NAMES = ("since", "until", "services", "models", "hosts", "instances", "gpus",
                "gpu_models", "regions", "finish_reasons", "error", "lows", "highs", "attrs",
                "span_names")


def parse_time(text: str | None, flag: str) -> int | None:
    """``--since``/``--until`` in the one time grammar, a bad one as a one-line error."""
    if not text:
        return None
    try:
        return parse_since(text)
    except click.BadParameter as exc:
        raise SearchError(f"{flag} {text!r}: {exc.message}") from None


def _many(help_text: str, *names: str) -> Callable[[F], F]:
    return click.option(*names, multiple=True, help=help_text + " (repeat for any of several).")


_OPTIONS: tuple[Callable[[F], F], ...] = (
    click.option("--since", default=None, help="Requests arriving at or after: 2h (ago), "
                 "now-2h, an ISO time, a Unix time."),
    click.option("--until", default=None, help="Requests arriving before (same forms)."),
    _many("Service name", "--service", "services"),
    _many("Model", "--model", "models"),
    _many("Host name", "--host", "hosts"),
    _many("Engine instance id", "--instance", "instances"),
    _many("GPU UUID the request's instance ran on", "--gpu", "gpus"),
    _many("GPU model (a requests dimension)", "--gpu-model", "gpu_models"),
    _many("Region (a requests dimension)", "--region", "regions"),
    _many("Finish reason (stop, length, abort, ...)", "--finish-reason", "finish_reasons"),
    click.option("--errors/--no-errors", "error", default=None,
                 help="Only failed requests / only successful ones [default: both]."),
    click.option("--min", "lows", multiple=True, metavar="COLUMN=N",
                 help=f"At least N in a numeric column, e.g. {c.E2E_S}=2, "
                      f"{c.INPUT_TOKENS}=4000."),
    click.option("--max", "highs", multiple=True, metavar="COLUMN=N",
                 help=f"At most N in a numeric column, e.g. {c.TTFT_S}=0.5."),
    click.option("--attr", "attrs", multiple=True, metavar="KEY[OP VALUE]",
                 help="A span of the trace has the attribute (span first, else resource): "
                      "KEY (present), KEY=V, KEY!=V, KEY>N, KEY>=N, KEY<N, KEY<=N. Several "
                      "--attr must hold on one span."),
    _many("A span of the trace has this name (the operation; with --attr: the same span)",
          "--span-name", "span_names"),
)


def filter_options(function: F) -> F:
    """Add the search's filter options (parameters :data:`FILTER_NAMES`) to a command."""
    for option in reversed(_OPTIONS):
        function = option(function)
    return function


def query_of(since: str | None, until: str | None, services: tuple[str, ...],
             models: tuple[str, ...], hosts: tuple[str, ...], instances: tuple[str, ...],
             gpus: tuple[str, ...], gpu_models: tuple[str, ...], regions: tuple[str, ...],
             finish_reasons: tuple[str, ...], error: bool | None, lows: tuple[str, ...],
             highs: tuple[str, ...], attrs: tuple[str, ...], span_names: tuple[str, ...],
             **page: Any) -> TraceQuery:  # noqa: ANN401 - sort, limit, offset as TraceQuery's
    """The :class:`TraceQuery` of the filter options' values (``page``: sort and page).

    Raises:
        SearchError: a filter that does not parse.
    """
    return TraceQuery(
        start_ns=parse_time(since, "--since"), end_ns=parse_time(until, "--until"),
        services=services, models=models, hosts=hosts, instances=instances, gpus=gpus,
        gpu_models=gpu_models, regions=regions, finish_reasons=finish_reasons, error=error,
        bounds=merge_bounds([parse_bound(v, "--min") for v in lows],
                            [parse_bound(v, "--max") for v in highs]),
        attrs=tuple(parse_attr(v) for v in attrs), span_names=span_names, **page)
