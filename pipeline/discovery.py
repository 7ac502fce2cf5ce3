"""Discovery: which raw segments are new since the last run, and which hours they make dirty.

A segment is *new* when the state does not list it or its size changed. Each new segment's
event-time columns are read and aggregated on their own (extent, per-host maxima, the hours its
rows touch), so memory stays bounded by a segment or two however much is new; segments are
aggregated two at a time on worker threads (Polars releases the GIL) and merged in path order,
so the result does not depend on the threads. On a first or full run a metrics segment whose
rows start in one hour (what the collector writes) is summarised from its per-host minimum and
maximum timestamps alone (:func:`metric_facts`).

A span touches the hours from its start to its end; a metric point the hours from its
timestamp to one sample gap later (the next sample's delta needs it), and for phase 2 (energy
and windows) also the hours one gap before it, where its sample's energy interval can start.
Rows older than their host's watermark minus the lateness are too late: counted, not used to
reopen hours.

Two bounds keep one bad clock from blinding a host (issue 16, item 5): a row's event time
counts for the watermark only up to its receive time plus ``future_ns`` (a span dated days
ahead would otherwise make every genuine span of its host "too late"), and a row dirties at
most ``max_row_ns`` after its start (a span from -7 to +7 days dirtied 332 hours; the energy
stage never looks further back than ``max_request_s`` anyway).
"""

from __future__ import annotations

import bisect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import polars as pl

from fleetlens.pipeline.partitions import HOUR_NS, NS
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.state import PipelineState, Segment
from fleetlens.pipeline.storage import DataDir, is_remote, parquet_files, polars_options

#: The raw signals (folders under raw/) the pipeline reads.
SIGNALS = ("spans", "metrics")
#: Segments aggregated at once (the target machine's two cores).
PARALLEL = 2
_HOUR_BITS = 21  # hour numbers since the epoch fit in 21 bits until 2209


@dataclass
class Discovered:
    """What discovery found: dirty hours and the counts the run summary reports."""

    dirty: set[int] = field(default_factory=set)
    energy_dirty: set[int] = field(default_factory=set)
    #: Phase-1 dirty hours some new span overlaps (their requests are recomputed).
    span_dirty: set[int] = field(default_factory=set)
    #: Per phase-1 dirty hour, the hosts with new metric points phase 1 of that hour reads
    #: ("" for points without a host): only these hosts' point tables need recomputing.
    point_hosts: dict[int, set[str]] = field(default_factory=dict)
    #: The new segments (paths relative to the data dir).
    new: set[str] = field(default_factory=set)
    new_segments: int = 0
    new_rows: int = 0
    too_late_rows: int = 0
    export_delay_s: dict[str, float] = field(default_factory=dict)


def list_segments(dd: DataDir) -> dict[str, tuple[str, int]]:
    """Every published raw segment: path relative to the data dir -> (signal, size).

    On an object store the listing carries the sizes: one LIST per 1,000 segments, no HEAD.
    """
    out = {}
    for signal in SIGNALS:
        for path in parquet_files(dd.raw(signal)):
            out[str(path.relative_to(dd.root))] = (signal, path.stat().st_size)
    return out


def scan_segment(dd: DataDir, rel: str) -> pl.LazyFrame:
    """A lazy scan of one raw segment (``rel`` to the data dir), local or on an object store."""
    path = dd.root / rel
    return pl.scan_parquet(str(path) if is_remote(path) else path,
                           storage_options=polars_options(dd.root))


#: Defaults of :func:`discover`'s bounds (``PipelineConfig`` passes its own).
FUTURE_NS = 300 * NS
MAX_ROW_NS = 3600 * NS


def event_rows(dd: DataDir, signal: str, rel: str, marks: pl.DataFrame, gap_ns: int,
               lateness_ns: int, future_ns: int = FUTURE_NS,
               max_row_ns: int = MAX_ROW_NS) -> pl.DataFrame:
    """(host, lo, hi, back, end, received, event_end, late) per row of one segment: the event
    time a row can affect (phase 1 from ``lo`` to ``hi``, at most ``max_row_ns`` after
    ``lo``; phase 2 from ``back``), its event time for the watermark (``end``, at most
    ``future_ns`` past its receive time; ``event_end`` unbounded, for the export delay), and
    whether it is older than its host's watermark (``marks``) minus the lateness."""
    frame = scan_segment(dd, rel)
    if signal == "spans":
        lo, hi, end = pl.col(c.START_NS), pl.col(c.END_NS), pl.col(c.END_NS)
        back = lo
    else:
        lo, hi, end = pl.col(c.TS_NS), pl.col(c.TS_NS) + gap_ns, pl.col(c.TS_NS)
        back = lo - gap_ns
    latest = pl.col(c.RECEIVED_NS) + future_ns  # null (unknown) bounds nothing
    rows = frame.select(
        pl.col(c.HOST_NAME).fill_null(""), lo.alias("lo"), back.alias("back"),
        pl.max_horizontal(pl.min_horizontal(hi, lo + max_row_ns), lo).alias("hi"),
        pl.min_horizontal(end, latest).alias("end"),
        pl.col(c.RECEIVED_NS).alias("received"),
        # Unbounded, for the export delay: a clock running ahead must show as its full skew
        # (that is what the delay is reported for), even where the watermark is capped.
        end.alias("event_end"),
    ).collect()
    if marks.height == 0:  # a first or full run: nothing can be late
        return rows.with_columns(pl.lit(False).alias("late"))
    rows = rows.join(marks, on=c.HOST_NAME, how="left", maintain_order="left")
    late = pl.col("end") < pl.col("mark") - lateness_ns
    return rows.with_columns(late.fill_null(False).alias("late")).drop("mark")


def segment_facts(rows: pl.DataFrame, signal: str) -> tuple[pl.DataFrame, list[int]]:
    """Per-host stats of one segment's :func:`event_rows`, and the distinct (first, last,
    earliest) hour numbers of its on-time rows, packed into one integer each."""
    # The export delay is reported for spans only: no per-host median (a sort) over the
    # millions of metric points.
    delay = (((pl.col("received") - pl.col("event_end")) / NS).median() if signal == "spans"
             else pl.lit(None, pl.Float64))
    stats = rows.group_by(c.HOST_NAME).agg(
        pl.len().alias("n"), pl.col("lo").min(), pl.col("hi").max(),
        pl.col("end").max(), pl.col("late").sum().alias("late"), delay.alias("delay"),
    ).with_columns(pl.lit(signal).alias("signal"))
    hour = [pl.col(k).clip(0, (1 << _HOUR_BITS) * HOUR_NS - 1) // HOUR_NS
            for k in ("lo", "hi", "back")]
    on_time = rows.filter(~pl.col("late"))
    if on_time.height == 0:
        return stats, []
    first, first_max, last, earliest = on_time.select(
        hour[0].min().alias("a"), hour[0].max().alias("b"), hour[1].max().alias("c"),
        hour[2].min().alias("d")).row(0)
    if first == first_max:
        # Every row starts in one hour (the collector cuts segments by hour): the hours its
        # rows touch then run from that hour to the latest end without a hole, and the
        # earliest energy hour is the minimum. Exact, without looking at every row's triple.
        return stats, [(first << 2 * _HOUR_BITS) | (last << _HOUR_BITS) | earliest]
    # Packed so that finding the distinct triples hashes one column.
    packed = on_time.select(
        (hour[0] * (1 << 2 * _HOUR_BITS) + hour[1] * (1 << _HOUR_BITS) + hour[2]).unique())
    return stats, packed.to_series().to_list()


def metric_facts(dd: DataDir, rel: str, gap_ns: int, future_ns: int = FUTURE_NS,
                 max_row_ns: int = MAX_ROW_NS) -> tuple[pl.DataFrame, list[int]] | None:
    """:func:`segment_facts` of a metrics segment when no host has a watermark yet (a first or
    full run: nothing can be late), from its host and timestamp columns alone.

    A metric point's event times are all its timestamp shifted by the sample gap, so the
    per-host minimum and maximum timestamp give every per-host fact and, when all rows start
    in one hour, the segment's hours: no per-row columns are built and no row is read twice.
    The collector publishes about 230 such segments an hour for a 64-GPU fleet. None when the
    rows start in more than one hour (then only the row-by-row path is exact).
    """
    per_host = scan_segment(dd, rel).group_by(
        pl.col(c.HOST_NAME).fill_null("")).agg(
        pl.len().alias("n"), pl.col(c.TS_NS).min().alias("lo"),
        pl.col(c.TS_NS).max().alias("last"),
        # per host: no point counts past the newest receive time plus the future bound
        pl.min_horizontal(pl.col(c.TS_NS),
                          pl.col(c.RECEIVED_NS) + future_ns).max().alias("end")).collect()
    reach = min(gap_ns, max_row_ns)  # what event_rows gives each point
    stats = per_host.select(
        c.HOST_NAME, "n", "lo", (pl.col("last") + reach).alias("hi"), "end",  # hi: phase 1
        pl.lit(0, pl.UInt32).alias("late"), pl.lit(None, pl.Float64).alias("delay"),
        pl.lit("metrics").alias("signal"))
    if stats.height == 0 or stats.get_column("lo").null_count() == stats.height:
        return stats, []
    top = (1 << _HOUR_BITS) * HOUR_NS - 1

    def hour(ns: int) -> int:
        return min(max(ns, 0), top) // HOUR_NS

    lo, top_ts = int(stats.get_column("lo").min()), int(per_host.get_column("last").max())
    first, first_max = hour(lo), hour(top_ts)
    if first != first_max:
        return None
    last, earliest = hour(top_ts + reach), hour(lo - gap_ns)
    return stats, [(first << 2 * _HOUR_BITS) | (last << _HOUR_BITS) | earliest]


def add_hours(keys: list[int], dirty: set[int], energy_dirty: set[int]) -> None:
    """Add the hour starts (ns) that :func:`segment_facts` keys make dirty: phase 1 from the
    first to the last hour, phase 2 also from the earliest hour."""
    mask = (1 << _HOUR_BITS) - 1
    for key in keys:
        first, last, earliest = key >> 2 * _HOUR_BITS, (key >> _HOUR_BITS) & mask, key & mask
        dirty.update(range(first * HOUR_NS, (last + 1) * HOUR_NS, HOUR_NS))
        energy_dirty.update(range(earliest * HOUR_NS, first * HOUR_NS, HOUR_NS))


def hosts_by_hour(stats: pl.DataFrame, hours: set[int]) -> dict[int, set[str]]:
    """Per hour of ``hours``, the hosts whose rows in ``stats`` (per segment and host: the
    extent ``lo`` to ``hi`` their rows affect in phase 1) reach into it. A superset of the
    hosts with a new row phase 1 of that hour reads (an extent may have holes), which is all
    the dirty-host bookkeeping needs."""
    ordered = sorted(hours)
    out: dict[int, set[str]] = {}
    for host, lo, hi in stats.select(c.HOST_NAME, "lo", "hi").iter_rows():
        if lo is None or hi is None:
            continue
        first = bisect.bisect_left(ordered, lo - lo % HOUR_NS)
        for hour in ordered[first:bisect.bisect_right(ordered, hi)]:
            out.setdefault(hour, set()).add(host)
    return out


def discover(dd: DataDir, state: PipelineState, gap_ns: int, lateness_ns: int,
             future_ns: int = FUTURE_NS, max_row_ns: int = MAX_ROW_NS) -> Discovered:
    """Register the new segments in ``state`` (and forget vanished ones); return what changed.

    ``future_ns`` bounds how far past its receive time a row moves its host's watermark,
    ``max_row_ns`` how far past its start one row makes hours dirty.
    """
    listing = list_segments(dd)
    for rel in [r for r in state.segments if r not in listing]:
        del state.segments[rel]  # compacted away or expired
    new = [(rel, sig, size) for rel, (sig, size) in sorted(listing.items())
           if rel not in state.segments or state.segments[rel].size != size]
    found = Discovered(new_segments=len(new))
    marks = pl.DataFrame({c.HOST_NAME: list(state.watermarks),
                          "mark": list(state.watermarks.values())},
                         schema={c.HOST_NAME: pl.String, "mark": pl.Int64})

    def facts(item: tuple[str, str, int]) -> tuple[pl.DataFrame, list[int]]:
        rel, signal, _size = item
        if signal == "metrics" and marks.height == 0:
            quick = metric_facts(dd, rel, gap_ns, future_ns, max_row_ns)
            if quick is not None:
                return quick
        return segment_facts(event_rows(dd, signal, rel, marks, gap_ns, lateness_ns,
                                        future_ns, max_row_ns), signal)

    per_host: list[pl.DataFrame] = []
    found.new = {rel for rel, _, _ in new}
    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="discover") as pool:
        for (rel, signal, size), (stats, keys) in zip(new, pool.map(facts, new), strict=True):
            add_hours(keys, found.dirty, found.energy_dirty)
            if signal == "spans":
                add_hours(keys, found.span_dirty, set())
            state.segments[rel] = Segment(
                signal, size, int(stats["lo"].min() or 0), int(stats["hi"].max() or 0),
                int(stats["n"].sum()))
            per_host.append(stats)
    found.energy_dirty |= found.dirty
    if not per_host:
        return found
    stats = pl.concat(per_host)
    found.point_hosts = hosts_by_hour(stats.filter(pl.col("signal") == "metrics"), found.dirty)
    found.new_rows = int(stats["n"].sum())
    found.too_late_rows = int(stats["late"].sum())
    for host, mark in stats.group_by(c.HOST_NAME).agg(pl.col("end").max()).iter_rows():
        state.watermarks[host] = max(state.watermarks.get(host, mark), mark)
    # The median of the segments' medians: exact enough to expose clock skew.
    delays = stats.filter(pl.col("signal") == "spans").group_by(c.HOST_NAME).agg(
        pl.col("delay").median())
    found.export_delay_s = {h: round(float(d), 3) for h, d in delays.sort(c.HOST_NAME)
                            .iter_rows() if d is not None}
    return found
