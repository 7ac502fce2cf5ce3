"""Series: `windows` (or grouped `requests`) in long form, one row per (series, window).

A series is one metric of one scope. Its name is ``metric{k1=v1,k2=v2}`` (Prometheus style),
e.g. ``e2e_p99_s{service_name=chat,model=llama,host_name=h07}``, and ``level`` says whether
the scope is one host, one service/model (``host_name = '*'``) or the whole fleet.
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.schema import FLEET_WIDE, validate
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

LEVEL_HOST = "host"
LEVEL_SERVICE = "service"
LEVEL_FLEET = "fleet"
_SCOPE = (c.SERVICE_NAME, c.MODEL, c.HOST_NAME)


def series_name(metric: pl.Expr | str, keys: list[str]) -> pl.Expr:
    """Expression building ``metric{k=v,...}`` from key columns."""
    parts: list[pl.Expr] = [pl.lit(metric) if isinstance(metric, str) else metric, pl.lit("{")]
    for i, key in enumerate(keys):
        parts += [pl.lit(("," if i else "") + key + "="), pl.col(key).cast(pl.String)]
    parts.append(pl.lit("}"))
    return pl.concat_str(parts)


def pick_window_s(windows: pl.LazyFrame, wanted: int) -> int | None:
    """``wanted`` if `windows` has rows of that size, else the smallest size present."""
    sizes = windows.select(pl.col(c.WINDOW_S).unique()).collect()[c.WINDOW_S].to_list()
    if not sizes:
        return None
    return wanted if wanted in sizes else min(sizes)


def window_series(windows: pl.LazyFrame | pl.DataFrame, metrics: list[str],
                  window_s: int) -> pl.LazyFrame:
    """Stage: `windows` -> long series frame.

    Input: `windows` rows of one window size. Output grain: one row per (series, ts_ns) with
    columns ``series, metric, service_name, model, host_name, level, ts_ns, value, requests``.
    Rows whose value is null are dropped (no requests, no percentile). Invariant: every
    output row comes from exactly one `windows` row and metric.
    """
    frame = validate(windows.lazy(), t.WINDOWS)
    present = [m for m in metrics if m in frame.collect_schema().names()]
    long = (
        frame.filter(pl.col(c.WINDOW_S) == window_s)
        .select([*_SCOPE, c.WINDOW_START_NS, c.REQUESTS, *present])
        .unpivot(index=[*_SCOPE, c.WINDOW_START_NS, c.REQUESTS], on=present,
                 variable_name=c.METRIC, value_name=c.VALUE)
        .filter(pl.col(c.VALUE).is_not_null() & pl.col(c.VALUE).is_finite())
        .rename({c.WINDOW_START_NS: c.TS_NS})
    )
    return long.with_columns(
        series_name(pl.col(c.METRIC), list(_SCOPE)).alias(c.SERIES),
        level_expr().alias(c.LEVEL),
        pl.col(c.VALUE).cast(pl.Float64),
    ).select(c.SERIES, c.METRIC, *_SCOPE, c.LEVEL, c.TS_NS, c.VALUE, c.REQUESTS)


def level_expr() -> pl.Expr:
    """``host`` / ``service`` / ``fleet`` from the scope columns."""
    return (
        pl.when(pl.col(c.HOST_NAME) != FLEET_WIDE).then(pl.lit(LEVEL_HOST))
        .when((pl.col(c.SERVICE_NAME) == FLEET_WIDE) | (pl.col(c.MODEL) == FLEET_WIDE))
        .then(pl.lit(LEVEL_FLEET))
        .otherwise(pl.lit(LEVEL_SERVICE))
    )


#: Request-level metric family of TTFT per uncached prompt token: prefill-side causes (a
#: slower or throttled GPU prefilling) move it whatever the prompt mix does, while longer
#: prompts or lost prefix reuse move TTFT but not this (they have more tokens, not slower).
TTFT_PER_TOKEN = "ttft_per_token"
#: Prefill time per uncached prompt token: the device's prefill speed alone (no queue), for
#: comparing an instance with its peers (a backlogged instance's TTFT holds its queue).
PREFILL_PER_TOKEN = "prefill_per_token"
_PER_TOKEN = (TTFT_PER_TOKEN, PREFILL_PER_TOKEN)

_REQUEST_METRICS = {
    "e2e": c.E2E_S, "ttft": c.TTFT_S, "tpot": c.TPOT_S, "queue": c.QUEUE_S,
    "prefill": c.PREFILL_S, "decode": c.DECODE_S, "network": c.NETWORK_S,
}


def request_series(requests: pl.LazyFrame | pl.DataFrame, dims: list[str], window_s: int,
                   metrics: list[str]) -> pl.LazyFrame:
    """Stage: `requests` -> long series frame grouped by any dimensions.

    Input: `requests`. Output grain: one row per (metric, dims..., window) with the columns of
    :func:`window_series` (scope columns are ``'*'`` unless they are among ``dims``; the
    series name carries every dim). ``metrics`` are window column names such as
    ``e2e_p99_s`` or ``rps``. Invariant: windows are aligned to multiples of ``window_s``.
    """
    frame = validate(requests.lazy(), t.REQUESTS)
    names = frame.collect_schema().names()
    missing = [d for d in dims if d not in names]
    if missing:
        raise ValueError(f"requests have no dimension column(s) {missing}; present: {names}")
    step = window_s * 1_000_000_000
    aggs: list[pl.Expr] = [pl.len().cast(pl.Int64).alias(c.REQUESTS)]
    for metric in metrics:
        if metric == c.RPS:
            aggs.append((pl.len() / window_s).alias(metric))
            continue
        per_token = next((b for b in _PER_TOKEN if metric.startswith(b + "_")), None)
        if per_token:
            base, rest = per_token, metric.removeprefix(per_token + "_")
        else:
            base, _, rest = metric.partition("_")
        pct = rest.removesuffix("_s")
        if base not in (*_REQUEST_METRICS, *_PER_TOKEN) or not pct.startswith("p"):
            raise ValueError(f"cannot compute {metric!r} from requests")
        column = (_per_uncached_token(c.TTFT_S) if base == TTFT_PER_TOKEN
                  else _per_uncached_token(c.PREFILL_S) if base == PREFILL_PER_TOKEN
                  else pl.col(_REQUEST_METRICS[base]))
        aggs.append(column.quantile(int(pct[1:]) / 100, "linear").alias(metric))
    grouped = (
        frame.with_columns((pl.col(c.ARRIVAL_NS) // step * step).alias(c.TS_NS))
        .group_by([c.TS_NS, *dims]).agg(aggs)
        .unpivot(index=[c.TS_NS, *dims, c.REQUESTS], on=metrics, variable_name=c.METRIC,
                 value_name=c.VALUE)
        .filter(pl.col(c.VALUE).is_not_null())
    )
    scope = [pl.col(k).cast(pl.String) if k in dims else pl.lit(FLEET_WIDE).alias(k)
             for k in _SCOPE]
    return grouped.with_columns(
        *scope,
        series_name(pl.col(c.METRIC), dims).alias(c.SERIES),
    ).with_columns(level_expr().alias(c.LEVEL)).select(
        c.SERIES, c.METRIC, *_SCOPE, c.LEVEL, c.TS_NS, c.VALUE, c.REQUESTS
    )


def _per_uncached_token(column: str) -> pl.Expr:
    """``column`` (TTFT or prefill time) per uncached prompt token of each request."""
    uncached = (pl.col(c.INPUT_TOKENS) - pl.col(c.CACHED_TOKENS).fill_null(0)).clip(
        lower_bound=1)
    return pl.col(column) / uncached
