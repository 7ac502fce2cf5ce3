"""What the selection comparison adds to attribution's ranking (:mod:`analytics.traces.compare`).

Attribution's score (``share_of_excess x log2(lift)``) answers "what do the selected
requests hold more of than the rest"; three things make its first answer misleading on a
heatmap selection, and this module handles each:

- **At any time.** A latency band holds long prompts (TTFT) or short answers (TPOT) at every
  moment: a prompt or output bucket stands out in a band whatever happened in its span. A
  value whose share of the selection is no higher than its share of *the same band outside
  the span* is marked ``at_any_time`` and ranked after the values the span has more of.
  This needs no threshold: the band outside the span is the value's own control.
- **The same requests.** A host with one instance, that instance and its only GPU select the
  same requests, so they score the same and only a name broke the tie. Values that select
  exactly the same requests of the view are one difference, named by the finest place
  (GPU, instance, host), the others listed in ``same_as``: the data cannot tell them apart.
- **GPUs.** A request names its engine instance, not a GPU: a GPU of an instance on several
  GPUs is no value of any request, and the instance is the finest thing the comparison can
  name. Each instance difference carries the GPUs the instance holds (``instance_gpus``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import polars as pl

from fleetlens.analytics.attribution.dimensions import add_buckets
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetlens.analytics.attribution.dimensions import Finding
    from fleetlens.analytics.traces.compare import Selection

#: Fewer requests than this in the band outside the span and no value is called "at any
#: time" (a share of a handful of requests says nothing).
MIN_OUTSIDE = 20
#: Which of values selecting the same requests names them: the finest place first.
FINEST_FIRST = {d: i for i, d in enumerate((c.GPU_UUID, c.INSTANCE_ID, c.HOST_NAME))}
#: The view's column holding each request's instance's GPUs (space-separated, sorted).
GPUS_COLUMN = t.INSTANCE_GPUS


def outside_band(frame: pl.DataFrame, selection: Selection) -> pl.DataFrame:
    """The view's requests in the selection's latency band that arrived outside its span."""
    arrival, value = pl.col(c.ARRIVAL_NS), pl.col(selection.metric)
    expr = ((arrival < selection.start_ns) | (arrival >= selection.end_ns)) & value.is_not_null()
    if selection.low is not None:
        expr &= value >= selection.low
    if selection.high is not None:
        expr &= value <= selection.high
    return frame.filter(expr)


def outside_shares(outside: pl.DataFrame, findings: list[Finding]) -> dict[str, float] | None:
    """Each finding's share of the band outside the span, by ``dimension=value`` (``None``:
    too few requests there to compare with)."""
    if outside.height < MIN_OUTSIDE:
        return None
    labelled = add_buckets(outside)
    shares = {}
    for dim in dict.fromkeys(f.dimension for f in findings):
        if dim not in labelled.columns:
            continue
        counts = labelled.group_by(pl.col(dim).cast(pl.String)).len()
        for value, n in counts.iter_rows():
            if value is not None:
                shares[f"{dim}={value}"] = n / outside.height
    return shares


def order(findings: list[Finding], shares: dict[str, float] | None
          ) -> list[tuple[Finding, float | None]]:
    """``findings`` (best score first) with their share outside the span, the values the
    span has more of than the band outside it first, each part in score order."""
    if shares is None:
        return [(f, None) for f in findings]
    paired = [(f, shares.get(f"{f.dimension}={f.value}", 0.0)) for f in findings]
    return sorted(paired, key=lambda p: p[0].slow_share <= p[1])  # stable: scores kept


def same_requests(compared: Callable[[], pl.DataFrame],
                  findings: list[Finding]) -> list[list[Finding]]:
    """``findings`` in their order, each followed by the later ones selecting exactly the
    same requests of ``compared()`` (the selection and the rest, bucket columns added; built
    only when two findings have the same shares); those are not repeated on their own."""
    built = functools.cache(compared)
    groups: list[list[Finding]] = []
    taken: set[int] = set()
    for i, f in enumerate(findings):
        if i in taken:
            continue
        group = [f]
        for j in range(i + 1, len(findings)):
            g = findings[j]
            # Equal shares on both sides are necessary; the rows decide.
            if j not in taken and (g.slow_share, g.baseline_share) == (
                    f.slow_share, f.baseline_share) and _same_rows(built(), f, g):
                group.append(g)
                taken.add(j)
        # The finest place names the group (an instance, then its host).
        groups.append(sorted(group, key=lambda g: FINEST_FIRST.get(g.dimension, 99)))
    return groups


def _same_rows(frame: pl.DataFrame, a: Finding, b: Finding) -> bool:
    if a.dimension == b.dimension:
        return False
    left = frame[a.dimension].cast(pl.String) == a.value
    right = frame[b.dimension].cast(pl.String) == b.value
    return bool((left.fill_null(False) == right.fill_null(False)).all())


def instance_gpus(frame: pl.DataFrame, group: list[Finding]) -> tuple[str, ...]:
    """The GPUs of the instance a difference names (itself or one selecting the same
    requests), from the view's :data:`GPUS_COLUMN`; empty for any other dimension and for
    a GPU (an instance on one GPU is named by it)."""
    if GPUS_COLUMN not in frame.columns or group[0].dimension == c.GPU_UUID:
        return ()
    for f in group:
        if f.dimension == c.INSTANCE_ID:
            held = frame.filter(pl.col(c.INSTANCE_ID) == f.value)[GPUS_COLUMN].drop_nulls()
            return tuple(str(held[0]).split()) if held.len() else ()
    return ()


def with_instance_gpus(frame: pl.DataFrame, mapping: pl.DataFrame) -> pl.DataFrame:
    """Add :data:`GPUS_COLUMN` (the instance's GPUs, space-separated) to a view's requests;
    categorical, so a view of millions of rows holds one code per row."""
    if mapping.is_empty() or c.INSTANCE_ID not in frame.columns:
        return frame
    held = mapping.group_by(c.INSTANCE_ID).agg(
        pl.col(c.GPU_UUID).unique().sort().str.join(" ").cast(pl.Categorical)
        .alias(GPUS_COLUMN))
    return frame.join(held, on=c.INSTANCE_ID, how="left")
