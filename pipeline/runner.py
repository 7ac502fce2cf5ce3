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
   extent overlaps that hour; where only some hosts have new points (late data), only theirs
   are recomputed and the other hosts' published rows kept (:mod:`pipeline.dirtyhosts`);
4. phase 2, per phase-2-dirty hour, in the same (host group x hour) shards as phase 1 and a
   fleet-wide reduce (:mod:`pipeline.phase2`): ``energy`` over the slots of every request
   active in the hour, then ``windows``; requests from earlier, clean hours that ran into a
   dirty hour get their ``request_energy`` row replaced in place;
5. saves the state. Derived partitions are rewritten whole and sorted, so rerunning over the
   same raw data gives byte-identical files, and an incremental run gives the same files as a
   full recompute.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field

import polars as pl
import pyarrow as pa

from fleetlens.pipeline import energy as en
from fleetlens.pipeline import phase2kept
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.dirtyhosts import Kept, phase1_kept, phase1_scope
from fleetlens.pipeline.discovery import Discovered, discover
from fleetlens.pipeline.joblock import exclusive
from fleetlens.pipeline.partitions import (
    HOUR_NS,
    NS,
    existing_hours,
    hour_of,
    partition_file,
    publish,
    publish_staged,
    read_hours,
)
from fleetlens.pipeline.phases import (  # noqa: F401 - re-exported
    _CATEGORICAL,
    _COLUMNS,
    _SIGNALS,
    OUTPUT_FORMAT,
    OUTPUTS,
    PHASE1_PARALLEL,
    PHASE1_TABLES,
    Phase2Output,
    Progress,
    _active,
    _requests_active,
    fingerprint,
    phase1_files,
    phase1_hour,
    phase2_hour,
)
from fleetlens.pipeline.rangemerge import Staged, staging_folder, staging_root
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import Shard, plan_hour
from fleetlens.pipeline.shardsplit import segment_rows
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import (
    DataDir,
    damaged_error,
    remove_stale_tmp,
    remove_tree,
    unreadable_files,
)


@dataclass
class RunSummary:
    """What one run did (printed by ``fleetlens pipeline``)."""

    new_segments: int = 0
    new_rows: int = 0
    too_late_rows: int = 0
    dirty_hours: int = 0
    #: Hosts whose points phase 1 took from the published partitions instead of recomputing
    #: them (late data from other hosts, pipeline/dirtyhosts.py), summed over the hours.
    kept_host_hours: int = 0
    #: Hosts whose phase-2 results (energy, windows) were taken from the last run instead of
    #: recomputed (pipeline/phase2kept.py), summed over the hours.
    kept_host_hours_phase2: int = 0
    rows_written: dict[str, int] = field(default_factory=dict)
    #: Per host: median seconds from a span's end (host clock) to its receipt (collector
    #: clock) in this run; large or negative values point at clock skew or stalled exporters.
    export_delay_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


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
        #: Request partitions phase 2 read in this run, for the next hour's phase 2, and those
        #: phase 1 published in this run (:meth:`_hand_over`).
        self._requests_read: dict = {}
        #: End of the last hour whose requests phase 1 handed over in this run.
        self._handed_until = 0
        #: This run's discovery (which hosts' points are new in which hour).
        self._found: Discovered | None = None
        self._kept_hosts: dict[int, int] = {}
        #: Per hour phase 1 published in this run, the hosts whose points it rewrote (None:
        #: every host's, or its requests); hours a crashed run may have left half written;
        #: per phase-2 hour, the hosts it kept (pipeline/phase2kept.py).
        self._rewritten: dict[int, set[str] | phase2kept.Remodelled | None] = {}
        self._crashed: set[int] = set()
        self._kept_hosts2: dict[int, int] = {}

    # --- phase 1 -------------------------------------------------------------------------
    def _phase1(self, state: PipelineState, hour: int) -> list[tuple[str, pl.DataFrame]]:
        """Phase 1 of one hour: raw segments in, the hour's partitions out (not yet published).

        Reads nothing any other hour's phase 1 writes, so hours can run side by side. Its
        (host group x hour) shards (:mod:`pipeline.shards`) run one after the other on this
        thread, so a big hour holds one shard's raw rows at a time, after one pass that reads
        the hour's segments and splits them into the shards' rows (:mod:`pipeline.shardsplit`)."""
        shards = plan_hour(state, self.cfg, hour)
        # Several shards on a local disk: the halves stage their tables and the merge writes
        # each partition beside its file, a range at a time (pipeline/rangemerge.py).
        folder = staging_folder(self.dd, 1, hour) if len(shards) > 1 else None
        write_to = None if folder is None else {
            table: partition_file(self.dd, table, hour) for table in PHASE1_TABLES}
        return phase1_hour(self.cfg, phase1_files(state, self.dd, self.cfg, hour), hour,
                           shards, segment_rows(state, self.dd.root), folder, write_to,
                           self._kept(state, hour))

    def _kept(self, state: PipelineState, hour: int) -> Kept | None:
        """What phase 1 of ``hour`` keeps of its published partitions (counted in the
        summary; pipeline/dirtyhosts.py)."""
        kept = phase1_kept(self.dd, state, self.cfg, hour, self._found)
        if kept is not None:  # (one key per hour: safe from phase 1's threads)
            self._kept_hosts[hour] = len(state.watermarks) - len(kept.dirty)
        return kept

    def _published1(self, state: PipelineState, hour: int, tables: set[str]) -> None:
        """Record which hosts phase 1 of ``hour`` rewrote (``tables``: those it published)."""
        hosts = phase1_scope(state, self._found, self.cfg, hour)
        if hosts is None or hour in self._found.span_dirty:
            self._rewritten[hour] = None
        elif t.REQUESTS in tables:  # the dirty hosts' engines named other models
            self._rewritten[hour] = phase2kept.Remodelled(frozenset(hosts))
        else:
            self._rewritten[hour] = hosts

    def _plan2(self, state: PipelineState, hour: int) -> list[Shard]:
        """The shards of ``hour``'s phase 2: kept shards for the hosts none of whose inputs
        this run rewrote, when the last run saved the hour's energy partial
        (pipeline/phase2kept.py), else every host recomputed (:func:`plan_hour`)."""
        for read, hosts in self._rewritten.items():
            if isinstance(hosts, phase2kept.Remodelled):  # once, from its published files
                self._flush()
                self._rewritten[read] = phase2kept.remodelled_hosts(self.dd, read, hosts.hosts)
        dirty = None if self._found is None else phase2kept.dirty_hosts(
            state, self.cfg, hour, self._rewritten, self._crashed)
        shards = phase2kept.plan_kept(self.dd, state, self.cfg, hour, dirty)
        if shards is None:
            return plan_hour(state, self.cfg, hour)
        self._kept_hosts2[hour] = sum(len(s.hosts) for s in shards if s.kept)
        return shards

    def _phases(self, state: PipelineState, hours1: list[int], hours2: list[int],
                dirty2: set[int], summary: RunSummary) -> None:
        """Phase 1 of :data:`PHASE1_PARALLEL` hours at a time on worker threads (Polars and
        Parquet encoding release the GIL), and phase 2 on this thread as soon as the phase-1
        hours it reads are published, so the two overlap on the two cores.

        This thread publishes phase 1 in hour order and runs phase 2 in hour order, so the
        files and the summary are the same as one hour after the other."""
        horizon = phase2kept.horizon(self.cfg)  # how far after an hour its phase 2 reads
        self._requests_read = {}  # nothing read in an earlier run is trusted
        self._handed_until = 0
        waiting = deque(hours2)
        done2 = 0

        def phase2_until(next_unpublished: int | None) -> None:
            nonlocal done2
            while waiting and (next_unpublished is None
                               or waiting[0] + horizon <= next_unpublished):
                self.progress("energy+windows", done2, len(hours2))
                hour = waiting.popleft()
                self._phase2(hour, dirty2, summary, self._plan2(state, hour))
                done2 += 1

        def publish_hour(hour: int, outputs: Future[list[tuple[str, pl.DataFrame]]]) -> None:
            frames = outputs.result()
            self._published1(state, hour, {table for table, _ in frames})
            self._flush()  # at most one hour of output waiting to be written
            for table, frame in frames:
                self._publish(table, hour, frame, summary)
                if table == t.REQUESTS and isinstance(frame, pl.DataFrame):
                    self._hand_over(hour, frame)  # (a partition written by a merge is read)

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

    def _publish(self, table: str, hour: int, frame: pl.DataFrame | Staged,
                 summary: RunSummary) -> None:
        """Publish a partition on the writer thread: Parquet encoding (pyarrow) and Polars
        both release the GIL, so writing hour h overlaps computing the next step on the other
        core. Writes run one at a time in submission order; :meth:`_flush` waits for them."""
        if isinstance(frame, Staged):  # written by the reduce beside its place: renamed
            summary.rows_written[table] = summary.rows_written.get(table, 0) + frame.rows
            self._pending.append(self._writer.submit(publish_staged, self.dd, table, hour,
                                                     frame))
            return
        summary.rows_written[table] = summary.rows_written.get(table, 0) + frame.height
        self._pending.append(self._writer.submit(publish, self.dd, table, hour, frame))

    def _hand_over(self, hour: int, requests: pl.DataFrame) -> None:
        """Give phase 2 the ``requests`` partition phase 1 just published as the frame itself,
        not the file read back (decoding it again was about 5% of a run's CPU).

        The frame is what the file holds: the writer encodes this same frame, and the
        partition's columns (strings, integers, floats, booleans) decode to the dtypes they
        were written from. An empty frame publishes no file, so it is not handed over (phase 2
        then finds no partition, as when reading)."""
        if requests.height:
            self._requests_read[(partition_file(self.dd, t.REQUESTS, hour), None)] = requests
            self._handed_until = max(self._handed_until, hour + HOUR_NS)

    def _flush(self) -> None:
        """Wait for every submitted publish (re-raising the first failure)."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    # --- phase 2 -------------------------------------------------------------------------
    def _phase2(self, hour: int, dirty: set[int], summary: RunSummary,
                shards: list[Shard] | None = None) -> None:
        """Phase 2 of one hour, its (host group x hour) ``shards`` one after the other on this
        thread, then their reduce (:mod:`pipeline.phase2`)."""
        self._flush()  # it reads what phase 1 and the previous hours published
        out = phase2_hour(self.dd, self.cfg, hour, dirty, self._requests_read, shards)
        # The next hours read some of the same partitions (from `back` before their hour to
        # as far as their requests run): keep those, and those phase 1 handed over for later
        # hours. Phase 1 published them before phase 2 got here and publishes none of them
        # again in this run.
        back = -(-self.cfg.max_request_s * NS // HOUR_NS) * HOUR_NS
        until = max(hour + 2 * HOUR_NS + back, self._handed_until)
        # The next hour reads back to its energy extent's start minus `back`, and that start
        # can itself lie up to `back` before the hour (a request arrived then, still running):
        # two lookbacks. Keeping only one made every hour read the partition two hours back
        # from its file again (about 4% of a run's CPU on the bench day).
        keep = {partition_file(self.dd, t.REQUESTS, h)
                for h in range(hour + HOUR_NS - 2 * back, until, HOUR_NS)}
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
        self._save_groups(hour, out.groups)

    def _save_groups(self, hour: int, groups: pl.DataFrame | bytes | None) -> None:
        """Save the hour's energy partial after its partitions, on the writer thread, for a
        later run that keeps some hosts (pipeline/phase2kept.py)."""
        self._pending.append(self._writer.submit(phase2kept.save_groups, self.dd, hour, groups))

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
        self._clear_staging()
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
        self._found, self._kept_hosts = (None if full else found), {}
        self._rewritten, self._kept_hosts2 = {}, {}
        # Hours a run that died may have left half written keep no host; so do this run's,
        # should it die (the list goes once the state is saved).
        self._crashed = phase2kept.pending_hours(self.dd)
        pending = self._crashed | energy_dirty
        phase2kept.mark_pending(self.dd, pending)
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
        summary.kept_host_hours = sum(self._kept_hosts.values())
        summary.kept_host_hours_phase2 = sum(self._kept_hosts2.values())
        if full or not state.segments:
            oldest = min((hour_of(s.min_ns) for s in state.segments.values() if s.rows),
                         default=None)
            self._clear_orphans(energy_dirty, oldest)
        state.save(self.dd)
        if pending:
            phase2kept.clear_pending(self.dd)
        summary.seconds = round(time.perf_counter() - began, 3)
        return summary

    def _clear_staging(self) -> None:
        """Remove what a run that died left of its reduces (this one holds the job lock, so
        no other run is using them): the shards' staged pieces, and partitions written
        beside their place and never renamed into it."""
        if self.dd.remote:
            return
        if (root := staging_root(self.dd)).exists():
            remove_tree(root)
        for table in OUTPUTS:
            if (folder := self.dd.table_dir(table)).exists():
                remove_stale_tmp(folder)

    def _clear_orphans(self, keep: Iterable[int], oldest: int | None) -> None:
        """After a full run, remove derived partitions of hours with no raw data left (hours
        before the oldest raw data are retention's business and stay)."""
        keep = set(keep)
        phase2kept.remove_groups(self.dd, lambda hour: hour in keep or oldest is None
                                 or hour < oldest)
        for table in OUTPUTS:
            for hour in existing_hours(self.dd, table):
                if hour not in keep and oldest is not None and hour >= oldest:
                    publish(self.dd, table, hour, t.table(table).empty())
