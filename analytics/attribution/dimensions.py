"""Attribution step (b): which dimension values are over-represented among slow requests.

BubbleUp-style: requests of the incident period whose latency is above the baseline
period's 90th percentile are *slow*. For each value of each dimension (host, GPU, instance,
model, region, device type, prompt-length, output-length and cached-token-ratio buckets):

- ``lift`` = share of slow requests with the value / share of baseline requests with it;
- ``share_of_excess`` = the part of the total excess (latency above the baseline median,
  summed over the incident's requests) carried by requests with the value.

Findings are ranked by ``share_of_excess x log2(lift)``: a value must both stand out and
explain the spike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from fleetlens.pipeline.schema import columns as c

PROMPT_EDGES = (128, 512, 2048, 8192, 32768)
OUTPUT_EDGES = (32, 128, 512, 2048)
CACHED_EDGES = (0.25, 0.5, 0.75)
#: Request-level column for each latency metric family.
REQUEST_COLUMN = {
    "e2e": c.E2E_S, "ttft": c.TTFT_S, "tpot": c.TPOT_S, "queue": c.QUEUE_S,
    "prefill": c.PREFILL_S, "decode": c.DECODE_S,
}
_SMOOTH = 0.01


@dataclass(frozen=True)
class Finding:
    """One dimension value that stands out."""

    dimension: str
    value: str
    lift: float
    share_of_excess: float
    slow_share: float
    baseline_share: float
    score: float


def _bucket(column: str, edges: tuple[float, ...], fmt: str) -> pl.Expr:
    """Label ``column`` with its interval of ``edges`` (left-closed)."""
    x = pl.col(column).cast(pl.Float64)
    expr = pl.when(x < edges[0]).then(pl.lit(f"<{fmt.format(edges[0])}"))
    for lo, hi in zip(edges, edges[1:], strict=False):
        expr = expr.when(x < hi).then(pl.lit(f"{fmt.format(lo)}-{fmt.format(hi)}"))
    return expr.when(x.is_not_null()).then(pl.lit(f">={fmt.format(edges[-1])}"))


def add_buckets(frame: pl.DataFrame) -> pl.DataFrame:
    """Add prompt-length, output-length and cached-token-ratio bucket columns."""
    ratio = (pl.col(c.CACHED_TOKENS).fill_null(0)
             / pl.col(c.INPUT_TOKENS).clip(lower_bound=1)).alias("_ratio")
    return frame.with_columns(ratio).with_columns(
        _bucket(c.INPUT_TOKENS, PROMPT_EDGES, "{:.0f}").alias(c.PROMPT_BUCKET),
        _bucket(c.OUTPUT_TOKENS, OUTPUT_EDGES, "{:.0f}").alias(c.OUTPUT_BUCKET),
        _bucket("_ratio", CACHED_EDGES, "{:.2f}").alias(c.CACHED_RATIO_BUCKET),
    ).drop("_ratio")


def metric_column(metric: str) -> str:
    """The request-level column behind a window metric such as ``ttft_p99_s``."""
    return REQUEST_COLUMN.get(metric.split("_")[0], c.E2E_S)


def compare_dimensions(incident: pl.DataFrame, baseline: pl.DataFrame, metric: str,
                       dimensions: list[str], *, selected: bool = False) -> list[Finding]:
    """Rank dimension values by how much they stand out among slow incident requests.

    Args:
        incident: `requests` of the incident period (whole service/model scope).
        baseline: `requests` of the baseline period, same scope.
        metric: the incident's window metric (``e2e_p99_s``...) or a request column family.
        dimensions: dimension columns to try; missing or constant ones are skipped.
        selected: ``incident`` is a selection a user drew (a heatmap's time span and
            latency band, :mod:`analytics.traces.compare`) and ``baseline`` the rest of the
            view: every selected request counts as *slow* (the user chose them, whatever the
            rest's 90th percentile), and a request's excess is its distance from the rest's
            median either way (a band of fast requests has differences too). Off for
            incidents, whose results this leaves unchanged.
    """
    column = metric_column(metric)
    if incident.is_empty() or baseline.is_empty():
        return []
    inc, base = add_buckets(incident), add_buckets(baseline)
    dims = [*dimensions, c.PROMPT_BUCKET, c.OUTPUT_BUCKET, c.CACHED_RATIO_BUCKET]
    dims = [d for d in dict.fromkeys(dims) if d in inc.columns and d in base.columns]
    threshold = base[column].quantile(0.9, "linear")
    median = base[column].median()
    if threshold is None or median is None:
        return []
    slow = pl.lit(True) if selected else (pl.col(column) > threshold).fill_null(False)
    deviation = pl.col(column) - median
    excess = deviation.abs() if selected else deviation.clip(lower_bound=0)
    inc = inc.with_columns(slow.alias("_slow"), excess.fill_null(0).alias("_excess"))
    n_slow = int(inc["_slow"].sum())
    total_excess = float(inc["_excess"].sum())
    if n_slow == 0 or total_excess <= 0:
        return []
    findings = []
    for dim in dims:
        inc_stats = inc.group_by(pl.col(dim).cast(pl.String)).agg(
            pl.col("_slow").sum().alias("slow"), pl.col("_excess").sum().alias("excess"))
        base_stats = base.group_by(pl.col(dim).cast(pl.String)).agg(pl.len().alias("base"))
        joined = inc_stats.join(base_stats, on=dim, how="full", coalesce=True).fill_null(0)
        for row in joined.iter_rows(named=True):
            if row[dim] is None:
                continue
            slow_share = row["slow"] / n_slow
            base_share = row["base"] / base.height
            lift = (slow_share + _SMOOTH) / (base_share + _SMOOTH)
            share = row["excess"] / total_excess
            score = share * math.log2(lift) if lift > 1 else 0.0
            findings.append(Finding(dim, str(row[dim]), lift, share, slow_share, base_share,
                                    score))
    return rank_findings(findings)


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Best score first; ties by dimension and value. Scores are compared rounded: scores
    that tie (a host's only instance and its GPUs explain the same slow requests) differ in
    the last bits with the summation order of a parallel group_by, and the order must not
    depend on it (Ray and local runs publish the same bytes)."""
    return sorted(findings, key=lambda f: (-round(f.score, 9), f.dimension, f.value))
