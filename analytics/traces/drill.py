"""From a difference to its traces: the search that opens a selection's requests having one
dimension value (:func:`drill_query`), and that search as a ``fleetlens traces`` command
(:func:`command_of`). The dashboard turns the same search into a Traces page link."""

from __future__ import annotations

import dataclasses
import shlex
from typing import TYPE_CHECKING

from fleetlens.analytics.traces.query import Bound, TraceQuery
from fleetlens.pipeline.schema import columns as c

if TYPE_CHECKING:
    from fleetlens.analytics.traces.compare import Selection

#: dimension -> the TraceQuery field that filters on it
FIELDS = {c.HOST_NAME: "hosts", c.MODEL: "models", c.SERVICE_NAME: "services",
          c.INSTANCE_ID: "instances", c.GPU_UUID: "gpus", c.REGION: "regions",
          c.GPU_MODEL: "gpu_models", c.FINISH_REASON: "finish_reasons"}
#: bucket dimension -> the token column its labels bound
BUCKETS = {c.PROMPT_BUCKET: c.INPUT_TOKENS, c.OUTPUT_BUCKET: c.OUTPUT_TOKENS}
#: TraceQuery field -> its ``fleetlens traces`` flag
FLAGS = {"services": "--service", "models": "--model", "hosts": "--host",
         "instances": "--instance", "gpus": "--gpu", "gpu_models": "--gpu-model",
         "regions": "--region", "finish_reasons": "--finish-reason",
         "span_names": "--span-name"}


def bucket_bounds(label: str) -> tuple[float | None, float | None]:
    """A token bucket's label (``<128``, ``128-512``, ``>=32768``) as inclusive integer
    bounds: buckets are left-closed, token counts whole numbers."""
    if label.startswith(">="):
        return float(label[2:]), None
    if label.startswith("<"):
        return None, float(label[1:]) - 1
    low, _, high = label.partition("-")
    return float(low), float(high) - 1


def _narrow(bounds: tuple[Bound, ...], new: Bound) -> tuple[Bound, ...]:
    """``bounds`` with ``new`` added, intersected with a bound on the same column."""
    old = next((b for b in bounds if b.column == new.column), None)
    if old is not None:
        lows = [v for v in (old.low, new.low) if v is not None]
        highs = [v for v in (old.high, new.high) if v is not None]
        new = Bound(new.column, max(lows, default=None), min(highs, default=None))
    return (*(b for b in bounds if b.column != new.column), new)


def drill_query(query: TraceQuery, selection: Selection, dimension: str,
                value: str) -> TraceQuery | None:
    """The search for ``selection``'s requests of ``query`` having ``dimension=value``,
    slowest first; ``None`` when no search filter expresses the dimension (a cached-token
    ratio bucket, a device type: the difference lists trace ids instead)."""
    bounds = _narrow(query.bounds, Bound(selection.metric, selection.low, selection.high))
    changes: dict[str, object] = {}
    if dimension in FIELDS:
        changes[FIELDS[dimension]] = (value,)
    elif dimension in BUCKETS:
        bounds = _narrow(bounds, Bound(BUCKETS[dimension], *bucket_bounds(value)))
    else:
        return None
    start = max(v for v in (query.start_ns, selection.start_ns) if v is not None)
    end = min(v for v in (query.end_ns, selection.end_ns) if v is not None)
    return dataclasses.replace(query, **changes, start_ns=start, end_ns=end, bounds=bounds,
                               sort=selection.metric, descending=True, offset=0)


def _number(value: float) -> str:
    # repr: the shortest text that reads back as the same float, so the band is exact
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def command_of(query: TraceQuery, *extra: str) -> str:
    """``query`` as a ``fleetlens traces`` command line (times as Unix ns; ``extra``
    arguments, e.g. ``--data-dir``, appended)."""
    args = ["fleetlens", "traces"]
    for flag, ns in (("--since", query.start_ns), ("--until", query.end_ns)):
        if ns is not None:
            args += [flag, str(ns)]
    for field, flag in FLAGS.items():
        for value in getattr(query, field):
            args += [flag, value]
    if query.error is not None:
        args.append("--errors" if query.error else "--no-errors")
    for bound in query.bounds:
        for flag, value in (("--min", bound.low), ("--max", bound.high)):
            if value is not None:
                args += [flag, f"{bound.column}={_number(value)}"]
    for attr in query.attrs:
        args += ["--attr", str(attr)]
    args += ["--sort", f"{'-' if query.descending else ''}{query.sort}", *extra]
    return shlex.join(args)
