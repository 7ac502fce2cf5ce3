"""Natural surges: the latency spikes a replayed trace causes by itself, with no incident.

A replay of a production trace (the Azure conversation trace) brings its own bursts: a minute
with twice the usual arrivals on a fleet sized for the usual minute queues requests and moves
latency x10 and more. Such a spike is a real one; a detector that reports it, and names it
a traffic surge, is right, and counting it as a *false* incident would punish the detector for
seeing what an on-call engineer wants to see. The scorer therefore needs the ground truth of
these spikes too, and it can only come from the simulator: this module reads it from an
incident-free run's :class:`~fleetlens.simulator.control.LatencyProbe`.

A *natural surge* on a service is a run of minutes whose arrivals at its engines are at least
:data:`SURGE_RATIO` x the median minute of the :data:`LOOKBACK_MIN` minutes before, during
which (or within :data:`DRAIN_MIN` minutes after) a p90 of TTFT, time per output token or
end-to-end latency rose to at least :data:`~fleetlens.simulator.control.MIN_RATIO` x its own
median minute of the look-back (and :data:`~fleetlens.simulator.control.MIN_DELTA_S` more).
Both conditions are measured on the run itself, not on what a detector saw.

A *natural saturation* is the same for a KV cache that ran out of room with no burst: a daily
cycle's peak, or a replay's run of long conversations, pushes an undersized cache past its
blocks, and the engine preempts requests (evicts their blocks and recomputes them later),
which queues everyone behind them (random fleet 29007: an L40S service preempting 8-20 a
minute, queue +2-16 s). Its minutes are those in which at least :data:`SATURATION_SHARE` of
the requests that arrived were preempted, at least twice the look-back's usual share, with
latency moved as for a surge. The simulator's own record of each request's preemptions is
the ground truth here; the name that is right for it is ``kv_cache_pressure``, as
``traffic_surge`` is for a surge.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from fleetlens.pipeline.schema.bursts import BURST_RATIO
from fleetlens.simulator.control import MIN_DELTA_S, MIN_RATIO, LatencyProbe

#: a minute is a surge minute at this multiple of the look-back's median minute of arrivals:
#: a burst as the analytics define it (one constant, pipeline.schema.bursts)
SURGE_RATIO = BURST_RATIO
#: the look-back for the usual minute, minutes
LOOKBACK_MIN = 30
#: fewest earlier minutes before a minute is judged: the analytics judge a series from its
#: 5th window (``warmup_min_windows``, 60 s windows in the suites), so a burst in a run's
#: first quarter hour is an incident there and must be labelled here (random fleet 37005's
#: control: arrivals x1.8 and TTFT x5 in minute 11 were two "false" incidents named
#: traffic_surge while this look-back still wanted 15 minutes)
MIN_LOOKBACK_MIN = 5
#: after the last surge minute, how long the backlog may take to show and drain, minutes
DRAIN_MIN = 5
#: fewest requests in a minute for its arrivals or latency to mean anything
MIN_MINUTE_REQUESTS = 10
#: a minute is a saturation minute when this share of its arrivals was preempted at least once
SATURATION_SHARE = 0.05
_LATENCIES = ("ttft", "tpot", "e2e")
#: the right name for each kind of natural spike
SURGE_CAUSE, SATURATION_CAUSE = "traffic_surge", "kv_cache_pressure"
MIN_NS = 60 * 10**9


@dataclass(frozen=True)
class NaturalSurge:
    """One natural surge: the service, its window (ns) and what moved (ratios)."""

    service: str
    start_ns: int
    end_ns: int
    arrivals_ratio: float
    latency_ratio: float
    #: the cause an incident on it is right to name
    cause: str = SURGE_CAUSE


@dataclass(frozen=True)
class NaturalSaturation:
    """One natural saturation: the service, its window (ns), the largest share of a minute's
    arrivals preempted and how far latency moved (a ratio)."""

    service: str
    start_ns: int
    end_ns: int
    preempted_share: float
    latency_ratio: float
    cause: str = SATURATION_CAUSE


def _minutes(probe: LatencyProbe) -> pl.DataFrame:
    """Per (service, minute): arrivals and the p90 of each latency, with look-back medians."""
    # a row kept before preemptions were recorded has none
    rows = [(iid.split("/")[1], row[0], *row[1:4], row[6] if len(row) > 6 else 0)
            for iid, kept in probe.rows.items() for row in kept]
    if not rows:
        return pl.DataFrame()
    frame = pl.DataFrame(rows, schema=["service", "arrival", *_LATENCIES, "preemptions"],
                         orient="row")
    per_minute = (frame.with_columns((pl.col("arrival") // 60).cast(pl.Int64).alias("minute"))
                  .group_by("service", "minute")
                  .agg(pl.len().alias("n"), (pl.col("preemptions") > 0).mean().alias("preempted"),
                       *(pl.col(m).quantile(0.9).alias(m) for m in _LATENCIES)))
    # Every minute present (an idle minute has 0 arrivals), so the look-back is in minutes.
    grid = per_minute.group_by("service").agg(
        pl.int_range(pl.col("minute").min(), pl.col("minute").max() + 1).alias("minute")
    ).explode("minute")
    full = (grid.join(per_minute, on=["service", "minute"], how="left")
            .with_columns(pl.col("n").fill_null(0)).sort("service", "minute"))
    quiet = pl.when(pl.col("n") >= MIN_MINUTE_REQUESTS)
    look = {"window_size": LOOKBACK_MIN, "min_samples": MIN_LOOKBACK_MIN}
    return full.with_columns(
        pl.col("n").cast(pl.Float64).rolling_median(**look).shift(1).over("service")
        .alias("usual_n"),
        quiet.then(pl.col("preempted")).rolling_median(**look).shift(1).over("service")
        .alias("usual_preempted"),
        *(quiet.then(pl.col(m)).rolling_median(**look).shift(1).over("service")
          .alias(f"usual_{m}") for m in _LATENCIES),
    )


def natural_surges(probe: LatencyProbe) -> list[NaturalSurge]:
    """The natural surges of an incident-free run, from its probe (see module doc)."""
    out = []
    for service, rows in _services(probe):
        surges = [r for r in rows if r["usual_n"] and r["n"] >= MIN_MINUTE_REQUESTS
                  and r["arrivals_ratio"] >= SURGE_RATIO]
        out += [NaturalSurge(service, probe.start_ns + lo * MIN_NS,
                             probe.start_ns + hi * MIN_NS,
                             max(r["arrivals_ratio"] for r in chain), moved)
                for chain, lo, hi, moved in _chains(surges, rows)]
    return out


def natural_saturations(probe: LatencyProbe) -> list[NaturalSaturation]:
    """The natural saturations of an incident-free run, from its probe (see module doc)."""
    out = []
    for service, rows in _services(probe):
        full = [r for r in rows if r["n"] >= MIN_MINUTE_REQUESTS
                and r["usual_preempted"] is not None
                and r["preempted"] >= max(SATURATION_SHARE, 2 * r["usual_preempted"])]
        out += [NaturalSaturation(service, probe.start_ns + lo * MIN_NS,
                                  probe.start_ns + hi * MIN_NS,
                                  max(r["preempted"] for r in chain), moved)
                for chain, lo, hi, moved in _chains(full, rows)]
    return out


def _services(probe: LatencyProbe) -> list[tuple[str, list[dict]]]:
    """Per service, its minutes in order with how far each moved against its look-back."""
    minutes = _minutes(probe)
    if minutes.is_empty():
        return []
    busy = pl.col("n") >= MIN_MINUTE_REQUESTS
    ratios = [pl.when(busy & (pl.col(m) - pl.col(f"usual_{m}") >= MIN_DELTA_S))
              .then(pl.col(m) / pl.col(f"usual_{m}")) for m in _LATENCIES]
    minutes = minutes.with_columns(
        (pl.col("n") / pl.col("usual_n")).alias("arrivals_ratio"),
        pl.max_horizontal(ratios).fill_null(0.0).alias("latency_ratio"))
    return [(service, rows.sort("minute").to_dicts())
            for (service,), rows in minutes.group_by("service", maintain_order=True)]


def _chains(picked: list[dict], rows: list[dict]) -> list[tuple[list[dict], int, int, float]]:
    """Join picked minutes less than DRAIN_MIN apart; keep the chains latency moved in, each
    with its first minute, the minute after its drain allowance and the latency ratio."""
    chains: list[list[dict]] = []
    for r in picked:
        if chains and r["minute"] - chains[-1][-1]["minute"] <= DRAIN_MIN:
            chains[-1].append(r)
        else:
            chains.append([r])
    by_minute = {r["minute"]: r for r in rows}
    out = []
    for chain in chains:
        first, last = chain[0]["minute"], chain[-1]["minute"] + DRAIN_MIN
        moved = max(by_minute[m]["latency_ratio"] for m in range(first, last + 1)
                    if m in by_minute)
        if moved >= MIN_RATIO:
            out.append((chain, first, last + 1, moved))
    return out
