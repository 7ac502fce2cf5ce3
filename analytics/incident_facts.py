"""What attribution compared for each incident, as contract tables (issue 32).

Attribution ranks an incident's causes on three comparisons of the incident's requests
against a baseline period: the excess latency per phase, the dimension values
over-represented among the slow requests, and the periods themselves (the baseline clear of
other incidents of the scope, :func:`analytics.attribution.rank.clean_baseline`). Each
cause's ``evidence`` carries them; these stages lift them out of the best-ranked cause that
has them (a failure set off before the latency incident ranks first with no phases) into
`incident_phases`, `incident_dimensions` and `incident_periods`, so the incident page,
``fleetlens explain`` and the webhook render the numbers the causes were ranked on. A page
that compared its own slice of requests once contradicted ``explain`` (the demo's surge:
"queue -12,830 ms" on the page, "+4 ms" in ``explain``).

Every stage is ``LazyFrame -> LazyFrame``; input: `causes` (``evidence`` as written by
:mod:`analytics.attribution.rank`); output grain: one row per (incident, phase), per
(incident, dimension rank) and per incident.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.attribution.phases import PHASES
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

_MS = 1000.0


def _field(path: str, dtype: type[pl.DataType] = pl.Float64) -> pl.Expr:
    """A JSON path of the evidence as ``dtype`` (null where the evidence has none);
    nanoseconds are read as integers (a float keeps only 15-16 digits)."""
    return pl.col(c.EVIDENCE).str.json_path_match(path).cast(dtype, strict=False)


def attributed(causes: pl.LazyFrame) -> pl.LazyFrame:
    """The best-ranked cause of each incident whose evidence holds the phase split."""
    return (causes.filter(_field("$.phases.queue.share").is_not_null())
            .sort(c.INCIDENT_ID, c.RANK)
            .group_by(c.INCIDENT_ID, maintain_order=True).first())


def incident_phases(causes: pl.LazyFrame) -> pl.LazyFrame:
    """Stage: `causes` -> `incident_phases` (four rows per attributed incident, in
    :data:`PHASES` order; ``excess_s`` signed, ``share`` of the positive excess)."""
    top = attributed(causes)
    parts = [top.select(
        c.INCIDENT_ID, pl.lit(phase).alias(c.PHASE),
        (_field(f"$.phases.{phase}.excess_ms") / _MS).alias(c.EXCESS_S),
        _field(f"$.phases.{phase}.share").alias(c.SHARE),
        pl.lit(i).alias("_order"))
        for i, phase in enumerate(PHASES)]
    return (pl.concat(parts).sort(c.INCIDENT_ID, "_order").drop("_order")
            .cast(t.table(t.INCIDENT_PHASES).columns))


_DIMENSION = pl.Struct({c.DIMENSION: pl.String, c.DIMENSION_VALUE: pl.String,
                        c.LIFT: pl.Float64, c.SHARE_OF_EXCESS: pl.Float64})


def incident_dimensions(causes: pl.LazyFrame) -> pl.LazyFrame:
    """Stage: `causes` -> `incident_dimensions` (the top findings of each attributed
    incident, ``rank`` 1 = most over-represented among its slow requests)."""
    top = attributed(causes).select(
        c.INCIDENT_ID,
        pl.col(c.EVIDENCE).str.json_path_match("$.top_dimensions")
        .str.json_decode(pl.List(_DIMENSION)).alias("_dims"))
    return (top.explode("_dims").drop_nulls("_dims").unnest("_dims")
            .with_columns(pl.int_range(1, pl.len() + 1).over(c.INCIDENT_ID).alias(c.RANK))
            .select(list(t.table(t.INCIDENT_DIMENSIONS).columns))
            .cast(t.table(t.INCIDENT_DIMENSIONS).columns))


def incident_periods(incidents: pl.LazyFrame, causes: pl.LazyFrame) -> pl.LazyFrame:
    """Stage: `incidents` + `causes` -> `incident_periods` (one row per attributed
    incident: its period, the baseline period compared, the requests in each)."""
    top = attributed(causes).select(
        c.INCIDENT_ID,
        _field("$.baseline_period_ns.start", pl.Int64).alias(c.BASELINE_START_NS),
        _field("$.baseline_period_ns.end", pl.Int64).alias(c.BASELINE_END_NS),
        _field("$.requests.incident", pl.Int64).alias(c.INCIDENT_REQUESTS),
        _field("$.requests.baseline", pl.Int64).alias(c.BASELINE_REQUESTS))
    schema = t.table(t.INCIDENT_PERIODS).columns
    return (incidents.select(c.INCIDENT_ID, c.START_NS, c.END_NS)
            .join(top, on=c.INCIDENT_ID, how="inner")
            .select(list(schema)).cast(schema))


def incident_tables(incidents: pl.DataFrame, causes: pl.DataFrame
                    ) -> dict[str, pl.DataFrame]:
    """The three tables by name, collected (for the analytics run to publish)."""
    lazy = causes.lazy()
    return {
        t.INCIDENT_PHASES: incident_phases(lazy).collect(),
        t.INCIDENT_DIMENSIONS: incident_dimensions(lazy).collect(),
        t.INCIDENT_PERIODS: incident_periods(incidents.lazy(), lazy).collect(),
    }


__all__ = ["attributed", "incident_dimensions", "incident_periods", "incident_phases",
           "incident_tables"]
