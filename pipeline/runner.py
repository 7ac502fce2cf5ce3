"""The incremental job: raw segments newer than the state -> every derived table.

One run:

1. lists the raw segments and compares them with ``state/pipeline.json``: segments not seen
   before (or whose size changed) are *new*;
2. reads the new segments' event times (:mod:`pipeline.discovery`): the UTC hours they touch
   become *dirty* (for phase 2 also the hour a GPU sample's energy interval can start in);
   rows older than their host's watermark minus ``lateness_s`` are too late (counted, reported,
   kept in raw, not used to reopen old hours);
3. phase 1, per dirty hour: ``normalize`` (spans -> requests) and ``samples`` (metric points ->
   gpu_samples, engine_samples, instance_gpus), reading only the segments whose event-time
   extent overlaps that hour;
4. phase 2, per phase-2-dirty hour: ``energy`` over the slots of every request active in the
   hour, then ``windows``; requests from earlier, clean hours that ran into a dirty hour get
   their ``request_energy`` row replaced in place;
5. saves the state. Derived partitions are rewritten whole and sorted, so rerunning over the
   same raw data gives byte-identical files, and an incremental run gives the same files as a
   full recompute.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field

import polars as pl
import pyarrow as pa

from fleetlens.pipeline import energy as en
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.discovery import discover
from fleetlens.pipeline.gpupoints import gpu_points
from fleetlens.pipeline.joblock import exclusive
from fleetlens.pipeline.normalize import normalize
from fleetlens.pipeline.partitions import (
    HOUR_NS,
    NS,
    existing_hours,
    hour_of,
    hours_between,
    partition_file,
    publish,
    read_hours,
    read_raw,
)
from fleetlens.pipeline.pivot import as_split
from fleetlens.pipeline.samples import engine_samples, gpu_samples, instance_gpus
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir, damaged_error, unreadable_files
from fleetlens.pipeline.windows import windows

#: Version of the derived files' layout or meaning: a change recomputes them all on the next
#: run (2: request_energy keyed by trace_id/span_id, gpu_slot_energy added; 3: negative
#: vLLM phases and the TTFT of requests without tokens are null; 4: gpu_samples one row per
#: gpu_sample_interval_s, slot energy from the native points).
OUTPUT_FORMAT = 4
#: Derived tables this job owns (cleared for hours that lost all their raw data).
OUTPUTS = (t.REQUESTS, t.GPU_SAMPLES, t.ENGINE_SAMPLES, t.INSTANCE_GPUS, t.GPU_SLOT_ENERGY,
           t.REQUEST_ENERGY, t.GPU_WINDOW_ENERGY, t.WINDOWS)
_SIGNALS = {"spans": t.SPANS, "metrics": t.METRIC_POINTS}

#: The raw columns the stages read (the rest, e.g. events and links, are never loaded).
_COLUMNS = {
    "spans": (c.TRACE_ID, c.SPAN_ID, c.PARENT_SPAN_ID, c.NAME, c.KIND, c.START_NS, c.END_NS,
              c.STATUS_CODE, c.SERVICE_NAME, c.HOST_NAME, c.RESOURCE_ATTRIBUTES, c.ATTRIBUTES,
              c.RECEIVED_NS, c.GEN_AI_REQUEST_ID, c.GEN_AI_REQUEST_MODEL,
              c.GEN_AI_TIME_IN_QUEUE_S, c.GEN_AI_TTFT_S, c.GEN_AI_E2E_S, c.GEN_AI_PREFILL_S,
              c.GEN_AI_DECODE_S, c.GEN_AI_INFERENCE_S, c.GEN_AI_PROMPT_TOKENS,
              c.GEN_AI_COMPLETION_TOKENS),
    "metrics": (c.METRIC_NAME, c.UNIT, c.TS_NS, c.VALUE, c.TEMPORALITY, c.SERVICE_NAME,
                c.HOST_NAME, c.ATTRIBUTES),
}
#: Raw string columns read as Parquet dictionaries (pl.Categorical): a handful of distinct
#: values repeated over millions of rows, which the stages only ever group on.
_CATEGORICAL = {
    "spans": (),
    "metrics": (c.METRIC_NAME, c.UNIT, c.TEMPORALITY, c.SERVICE_NAME, c.HOST_NAME,
                c.ATTRIBUTES),
}

#: Hours whose phase 1 runs at once: the two cores of the target machine, with at most two
#: hours of metric points in memory (the 4 GB budget holds about two and a half).
PHASE1_PARALLEL = 2

Progress = Callable[[str, int, int], None]


@dataclass
class RunSummary:
    """What one run did (printed by ``fleetlens pipeline``)."""

    new_segments: int = 0
    new_rows: int = 0
    too_late_rows: int = 0
    dirty_hours: int = 0
    rows_written: dict[str, int] = field(default_factory=dict)
    #: Per host: median seconds from a span's end (host clock) to its receipt (collector
    #: clock) in this run; large or negative values point at clock skew or stalled exporters.
    export_delay_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def fingerprint(cfg: PipelineConfig) -> str:
    """Hash of the settings (and output format) that shape derived output: a change forces a
    full recompute."""
    relevant = {"window": cfg.window_s, "slot": cfg.slot_s, "dims": cfg.dimension_map(),
                "max_request_s": cfg.max_request_s, "gap": cfg.max_sample_gap_s,
                "gpu_interval": cfg.gpu_sample_interval_s, "format": OUTPUT_FORMAT}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _active(lo: int, hi: int) -> pl.Expr:
    """Requests with arrival < hi whose [arrival, end] reaches into [lo, hi)."""
    end = pl.max_horizontal(c.END_NS, c.ARRIVAL_NS)
    return (pl.col(c.ARRIVAL_NS) < hi) & ((end >= lo) | (pl.col(c.ARRIVAL_NS) >= lo))


def phase1_files(state: PipelineState, dd: DataDir, cfg: PipelineConfig,
                 hour: int) -> dict[str, list[str]]:
    """The raw segments phase 1 of ``hour`` reads, per signal (metric points from one sample
    gap before the hour: a GPU sample's interval starts there)."""
    gap_ns = int(cfg.max_sample_gap_s * NS)
    return {"metrics": state.files("metrics", hour - gap_ns, hour + HOUR_NS, dd.root),
            "spans": state.files("spans", hour, hour + HOUR_NS, dd.root)}


def phase1_hour(cfg: PipelineConfig, files: dict[str, list[str]],
                hour: int) -> list[tuple[str, pl.DataFrame]]:
    """Phase 1 of one hour as a pure function: the raw ``files`` (see :func:`phase1_files`)
    in, the hour's partitions out, nothing published (a runner publishes them, so a Ray task
    can run this anywhere the files can be read)."""
    lo, hi = hour, hour + HOUR_NS
    gap_ns = int(cfg.max_sample_gap_s * NS)
    points = read_raw(files["metrics"], _SIGNALS["metrics"],
                      pl.col(c.TS_NS).is_between(lo - gap_ns, hi, closed="left"),
                      _COLUMNS["metrics"], _CATEGORICAL["metrics"])
    in_hour = pl.col(c.TS_NS) >= lo
    points = as_split(points)  # once for the three samples stages
    mapping = instance_gpus(points.filter(in_hour))
    spans = read_raw(files["spans"], _SIGNALS["spans"],
                     (pl.col(c.START_NS) < hi) & (pl.col(c.END_NS) >= lo),
                     _COLUMNS["spans"], _CATEGORICAL["spans"])
    requests = normalize(spans, mapping, cfg.dimension_map()).filter(
        pl.col(c.ARRIVAL_NS).is_between(lo, hi, closed="left"))
    gpu_pts = gpu_points(points)  # once for gpu_samples and the energy
    gpu = gpu_samples(gpu_pts, cfg.max_sample_gap_s, cfg.gpu_sample_interval_s)
    # Measured energy per slot from the native points now, while they are in memory: phase 2
    # reads these few rows instead.
    slots = en.gpu_slot_energy(gpu_pts, cfg.slot_s, lo, cfg.max_sample_gap_s)
    eng = engine_samples(points).filter(in_hour)
    return [(t.REQUESTS, requests), (t.GPU_SAMPLES, gpu.filter(in_hour)),
            (t.ENGINE_SAMPLES, eng), (t.INSTANCE_GPUS, mapping), (t.GPU_SLOT_ENERGY, slots)]


@dataclass
class Phase2Output:
    """One hour's phase-2 partitions, not yet published."""

    gpu_window_energy: pl.DataFrame
    request_energy: pl.DataFrame
    windows: pl.DataFrame
    #: (arrival hour, fresh request_energy rows) of requests from clean earlier hours that
    #: ran into this one: merged into that hour's partition when published
    crossers: list[tuple[int, pl.DataFrame]]


def _requests_active(dd: DataDir, cfg: PipelineConfig, lo: int, hi: int,
                     cache: dict | None = None) -> pl.DataFrame:
    """Requests with arrival < hi whose [arrival, end] reaches into [lo, hi)."""
    back = -(-cfg.max_request_s * NS // HOUR_NS) * HOUR_NS
    frame = read_hours(dd, t.REQUESTS, range(hour_of(lo - back), hi, HOUR_NS), cache=cache)
    return frame.filter(_active(lo, hi))


def phase2_hour(dd: DataDir, cfg: PipelineConfig, hour: int, dirty: set[int],
                cache: dict | None = None) -> Phase2Output:
    """Phase 2 (energy, then windows) of one hour as a pure function of the phase-1
    partitions published in ``dd``: reads no phase-2 output, publishes nothing.

    ``cache``: request partitions already read (see :func:`read_hours`), which a caller running
    the hours of one run in order passes from hour to hour (each hour reads the one before it
    too); valid while none of them is published again. None: a fresh one."""
    lo, hi = hour, hour + HOUR_NS
    slot_ns = cfg.slot_s * NS
    gap_ns = int(cfg.max_sample_gap_s * NS)
    read: dict = {} if cache is None else cache  # what `active` reads serves `everyone` too
    active = _requests_active(dd, cfg, lo, hi, read)
    e_lo = min(lo, int(active[c.ARRIVAL_NS].min() or lo))
    e_hi = max(hi, int(active.select(pl.max_horizontal(c.END_NS, c.ARRIVAL_NS)).max()
                       .item() or hi) + 1)
    # A request running longer than max_request_s gets no energy past that (the hours
    # after look back only that far for requests still running).
    e_hi = min(e_hi, hi + cfg.max_request_s * NS)
    e_lo, e_hi = e_lo - e_lo % slot_ns, e_hi - e_hi % slot_ns + slot_ns
    # `active` is a subset of `everyone`: take it from there, with the energy keys.
    everyone = en.with_request_keys(_requests_active(dd, cfg, e_lo, e_hi, read))
    active = everyone.filter(_active(lo, hi))
    # A slot's measured energy comes from samples up to one gap after it, so from the
    # slot-energy partitions of its hour and the next.
    pieces = read_hours(dd, t.GPU_SLOT_ENERGY, hours_between(e_lo, e_hi + gap_ns))
    slots = en.gpu_slots(pieces.filter(
        pl.col(c.SLOT_START_NS).is_between(e_lo, e_hi, closed="left")))
    arrival_hours = everyone.select(
        (pl.col(c.ARRIVAL_NS) - pl.col(c.ARRIVAL_NS).mod(HOUR_NS)).unique().sort()
    ).to_series().to_list()
    mapping = pl.concat([
        read_hours(dd, t.INSTANCE_GPUS, [h]).with_columns(pl.lit(h).alias(en.HOUR))
        for h in arrival_hours
    ] or [t.table(t.INSTANCE_GPUS).empty().with_columns(pl.lit(0).alias(en.HOUR))],
        how="diagonal_relaxed")
    in_e = pl.col(en.SLOT).is_between(e_lo, e_hi, closed="left")
    weights = en.request_slot_weights(everyone, cfg.slot_s).filter(in_e)
    shares, per_slot = en.attribute(weights, everyone, mapping, slots, cfg.slot_s)
    in_hour = pl.col(en.SLOT).is_between(lo, hi, closed="left")
    per_slot = per_slot.filter(in_hour)
    gpu_windows = en.gpu_window_energy(per_slot, cfg.window_s)
    own = active.filter(pl.col(c.ARRIVAL_NS) >= lo)
    crossers = active.filter(pl.col(c.ARRIVAL_NS) < lo).with_columns(
        (pl.col(c.ARRIVAL_NS) - pl.col(c.ARRIVAL_NS).mod(HOUR_NS)).alias(en.HOUR))
    patches = [(int(h), en.request_energy(shares, group))
               for (h,), group in crossers.group_by(en.HOUR, maintain_order=True)
               if int(h) not in dirty]  # a dirty hour's own phase 2 writes them
    groups = en.group_energy(shares.filter(in_hour), everyone, per_slot, cfg.window_s)
    eng = read_hours(dd, t.ENGINE_SAMPLES, [hour - HOUR_NS, hour])
    eng = eng.filter(pl.col(c.TS_NS) >= lo - gap_ns)
    out = windows(own.drop(en.RIX, en.IID, en.GRP), eng, groups, cfg.window_s).filter(
        pl.col(c.WINDOW_START_NS) >= lo)
    return Phase2Output(gpu_windows, en.request_energy(shares, own), out, patches)


class Pipeline:
    """The pipeline over one data directory."""

    def __init__(self, data_dir: DataDir, cfg: PipelineConfig,
                 progress: Progress | None = None) -> None:
        self.dd = data_dir
        self.cfg = cfg
        self.progress = progress or (lambda _phase, _done, _total: None)
        self.gap_ns = int(cfg.max_sample_gap_s * NS)
        self.dims = cfg.dimension_map()
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future[int]] = []
        #: Request partitions phase 2 read in this run, for the next hour's phase 2.
        self._requests_read: dict = {}

    # --- phase 1 -------------------------------------------------------------------------
    def _phase1(self, state: PipelineState, hour: int) -> list[tuple[str, pl.DataFrame]]:
        """Phase 1 of one hour: raw segments in, the hour's partitions out (not yet published).

        Reads nothing any other hour's phase 1 writes, so hours can run side by side."""
        return phase1_hour(self.cfg, phase1_files(state, self.dd, self.cfg, hour), hour)

    def _phases(self, state: PipelineState, hours1: list[int], hours2: list[int],
                dirty2: set[int], summary: RunSummary) -> None:
        """Phase 1 of :data:`PHASE1_PARALLEL` hours at a time on worker threads (Polars and
        Parquet encoding release the GIL), and phase 2 on this thread as soon as the phase-1
        hours it reads are published, so the two overlap on the two cores.

        This thread publishes phase 1 in hour order and runs phase 2 in hour order, so the
        files and the summary are the same as one hour after the other."""
        # Phase 2 of hour h reads phase-1 output up to its requests' ends (at most
        # max_request_s after the hour) plus one sample gap and slot.
        horizon = HOUR_NS + self.cfg.max_request_s * NS + self.gap_ns + self.cfg.slot_s * NS
        self._requests_read = {}  # nothing read in an earlier run is trusted
        waiting = deque(hours2)
        done2 = 0

        def phase2_until(next_unpublished: int | None) -> None:
            nonlocal done2
            while waiting and (next_unpublished is None
                               or waiting[0] + horizon <= next_unpublished):
                self.progress("energy+windows", done2, len(hours2))
                self._phase2(waiting.popleft(), dirty2, summary)
                done2 += 1

        def publish_hour(hour: int, outputs: Future[list[tuple[str, pl.DataFrame]]]) -> None:
            frames = outputs.result()
            self._flush()  # at most one hour of output waiting to be written
            for table, frame in frames:
                self._publish(table, hour, frame, summary)

        running: deque[tuple[int, Future[list[tuple[str, pl.DataFrame]]]]] = deque()
        with ThreadPoolExecutor(PHASE1_PARALLEL, thread_name_prefix="phase1") as pool:
            for done, hour in enumerate(hours1):
                self.progress("normalize", done, len(hours1))
                if len(running) >= PHASE1_PARALLEL:
                    publish_hour(*running.popleft())
                    phase2_until(running[0][0] if running else hour)
                running.append((hour, pool.submit(self._phase1, state, hour)))
            while running:
                publish_hour(*running.popleft())
                phase2_until(running[0][0] if running else None)
        self.progress("normalize", len(hours1), len(hours1))
        phase2_until(None)
        self.progress("energy+windows", len(hours2), len(hours2))

    def _publish(self, table: str, hour: int, frame: pl.DataFrame, summary: RunSummary) -> None:
        """Publish a partition on the writer thread: Parquet encoding (pyarrow) and Polars
        both release the GIL, so writing hour h overlaps computing the next step on the other
        core. Writes run one at a time in submission order; :meth:`_flush` waits for them."""
        summary.rows_written[table] = summary.rows_written.get(table, 0) + frame.height
        self._pending.append(self._writer.submit(publish, self.dd, table, hour, frame))

    def _flush(self) -> None:
        """Wait for every submitted publish (re-raising the first failure)."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    # --- phase 2 -------------------------------------------------------------------------
    def _phase2(self, hour: int, dirty: set[int], summary: RunSummary) -> None:
        self._flush()  # it reads what phase 1 and the previous hours published
        out = phase2_hour(self.dd, self.cfg, hour, dirty, self._requests_read)
        # The next hours read some of the same partitions (from `back` before their hour to
        # as far as their requests run): keep those. Phase 1 published them before phase 2
        # got here and publishes none of them again in this run.
        back = -(-self.cfg.max_request_s * NS // HOUR_NS) * HOUR_NS
        keep = {partition_file(self.dd, t.REQUESTS, h)
                for h in range(hour + HOUR_NS - back, hour + 2 * HOUR_NS + back, HOUR_NS)}
        self._requests_read = {k: v for k, v in self._requests_read.items() if k[0] in keep}
        self._publish_phase2(hour, out, summary)

    def _publish_phase2(self, hour: int, out: Phase2Output, summary: RunSummary) -> None:
        """Publish one hour's phase-2 output: its own partitions, then the energy rows of
        crossers patched into their (clean) arrival hours, in the order they come."""
        self._publish(t.GPU_WINDOW_ENERGY, hour, out.gpu_window_energy, summary)
        self._publish(t.REQUEST_ENERGY, hour, out.request_energy, summary)
        for h, fresh in out.crossers:
            self._patch(h, fresh, summary)
        self._publish(t.WINDOWS, hour, out.windows, summary)

    def _patch(self, hour: int, fresh: pl.DataFrame, summary: RunSummary) -> None:
        """Replace the energy rows of requests from the clean earlier ``hour`` that ran into a
        dirty one with ``fresh`` (read-modify-write: published one after the other)."""
        self._flush()
        old = read_hours(self.dd, t.REQUEST_ENERGY, [hour])
        keep = old.join(fresh.select(en.REQUEST_KEY), on=en.REQUEST_KEY, how="anti",
                        maintain_order="left")
        merged = pl.concat([keep, fresh], how="diagonal_relaxed").sort(
            c.REQUEST_ID, *en.REQUEST_KEY)
        self._publish(t.REQUEST_ENERGY, hour, merged, summary)

    # --- the run ---------------------------------------------------------------------------
    def run_once(self, *, full: bool = False) -> RunSummary:
        """Process the raw segments that are new since the last run (all of them if ``full``).

        Holds the data directory's job lock (:mod:`pipeline.joblock`) for the whole run, so
        compaction, another pipeline and the analytics wait for it."""
        with exclusive(self.dd, "pipeline"):
            try:
                return self._run_once(full)
            except (pl.exceptions.ComputeError, pa.ArrowException, OSError) as exc:
                # Polars names no file when one is damaged: find the ones to move aside.
                bad = unreadable_files(self.dd.root / "raw")
                if bad:
                    raise damaged_error(self.dd, bad) from exc
                raise

    def _run_once(self, full: bool) -> RunSummary:
        began = time.perf_counter()
        summary = RunSummary()
        fp = fingerprint(self.cfg)
        # A full run needs nothing of the old state, so it also replaces a damaged one.
        state = PipelineState() if full else PipelineState.load(self.dd)
        if full or state.fingerprint != fp:
            state = PipelineState(fingerprint=fp)
        # One row dirties at most the longest request the energy stage looks back for (or
        # one sample gap, which a metric point needs), never days of hours.
        max_row_ns = max(self.cfg.max_request_s * NS, self.gap_ns)
        found = discover(self.dd, state, self.gap_ns, self.cfg.lateness_s * NS,
                         future_ns=self.cfg.max_future_skew_s * NS, max_row_ns=max_row_ns)
        dirty, energy_dirty = found.dirty, found.energy_dirty
        summary.new_segments, summary.new_rows = found.new_segments, found.new_rows
        summary.too_late_rows, summary.export_delay_s = found.too_late_rows, found.export_delay_s
        hours = sorted(energy_dirty)
        summary.dirty_hours = len(hours)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish") as self._writer:
            try:
                self._phases(state, sorted(dirty), hours, energy_dirty, summary)
            finally:  # even when failing: no write may outlive the run
                pending, self._pending = self._pending, []
                wait(pending)
            for future in pending:
                future.result()
        if full or not state.segments:
            oldest = min((hour_of(s.min_ns) for s in state.segments.values() if s.rows),
                         default=None)
            self._clear_orphans(energy_dirty, oldest)
        state.save(self.dd)
        summary.seconds = round(time.perf_counter() - began, 3)
        return summary

    def _clear_orphans(self, keep: Iterable[int], oldest: int | None) -> None:
        """After a full run, remove derived partitions of hours with no raw data left (hours
        before the oldest raw data are retention's business and stay)."""
        keep = set(keep)
        for table in OUTPUTS:
            for hour in existing_hours(self.dd, table):
                if hour not in keep and oldest is not None and hour >= oldest:
                    publish(self.dd, table, hour, t.table(table).empty())
