"""Accepted rows: WAL first, then memory, then atomic Parquet segments.

:meth:`Sink.accept` appends the request to the WAL and buffers its rows under one lock, then
waits for the group-commit fsync; only then may the receiver answer OK. A flusher thread
publishes the buffer by rows or age: it swaps the buffer and seals the WAL under the same lock
(so the sealed WAL files hold exactly the swapped rows), writes one Parquet file per signal and
hour with ``write_parquet_atomic``, and deletes the sealed WAL files only after that.
A publish that fails is retried with exponential backoff (``RETRY_FIRST_S`` doubling up to
``RETRY_MAX_S``), so a full disk costs one attempt and one log line every few seconds, not
twenty a second.
"""

from __future__ import annotations

import base64
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fleetlens.collector.durable import make_dirs_durable
from fleetlens.collector.errors import Overloaded, StorageFailure
from fleetlens.collector.faults import Faults
from fleetlens.collector.rows import plain_schema, table_bytes
from fleetlens.collector.signals import BY_CODE, SIGNALS, Signal
from fleetlens.collector.telemetry import Telemetry, log
from fleetlens.collector.wal import Wal
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, write_bytes_atomic

_HOUR_NS = 3600 * 10**9
#: Columns whose values are (nearly) all distinct: a dictionary there only costs CPU and bytes.
_DISTINCT = frozenset({c.TRACE_ID, c.SPAN_ID, c.PARENT_SPAN_ID, c.GEN_AI_REQUEST_ID})
#: How often the flusher looks whether the buffer is due.
POLL_S = 0.05
#: Wait after the first failed publish (or WAL seal); doubled per failure up to RETRY_MAX_S.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """Parquet encodings of a raw segment, by column type.

    Dictionaries only for strings that repeat (names, resource and attribute JSON), byte
    stream split for doubles, delta encoding for int64 (timestamps, counts). On 25,000
    vLLM-style spans (zstd, ``bench/ingest.py``): 111.7 -> 87.1 bytes per span and 43 -> 24 ms
    of CPU per segment against pyarrow's defaults (dictionary on every column).
    """
    encoding = {f.name: "BYTE_STREAM_SPLIT" for f in schema if pa.types.is_floating(f.type)}
    encoding.update({f.name: "DELTA_BINARY_PACKED" for f in schema
                     if pa.types.is_integer(f.type)})
    return {
        "use_dictionary": [f.name for f in schema
                           if pa.types.is_large_string(f.type) and f.name not in _DISTINCT],
        "column_encoding": encoding,
    }


def write_segment(table: pa.Table, path: Path, options: dict[str, Any]) -> None:
    """Publish ``table`` atomically as Parquet that reads back with plain string columns.

    Buffered resource and scope columns are dictionaries (``collector.rows``). Parquet
    stores them as dictionary-encoded strings either way, written straight from the Arrow
    dictionary (no rows x size copy); but pyarrow would also record the dictionary type in
    the file's Arrow schema, and readers would get dictionaries (Polars: Categorical). So
    the Arrow schema recorded is the plain one: readers see the same file as before.
    """
    stored = base64.b64encode(plain_schema(table.schema).serialize().to_pybytes())

    def write(handle: Any) -> None:
        # copies: pyarrow may add to the column_encoding dict it is given
        with pq.ParquetWriter(handle, table.schema, compression="zstd", store_schema=False,
                              use_dictionary=list(options["use_dictionary"]),
                              column_encoding=dict(options["column_encoding"])) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata({b"ARROW:schema": stored})

    write_bytes_atomic(path, write)


def int64_views(column: pa.ChunkedArray) -> list[memoryview]:
    """The values of a non-empty int64 column, one zero-copy view per non-empty chunk.

    Neither numpy (about 11 MiB of RSS per worker, see ``collector/supervisor.py``) nor
    ``pyarrow.compute`` (about 7 MiB): ``min``/``max`` over a view take 0.3 ms per 25,000
    rows. A null row (the decoders write none) reads as what its slot holds, so no row is
    ever left out of a segment.
    """
    return [memoryview(chunk.buffers()[1])[chunk.offset * 8:(chunk.offset + len(chunk)) * 8]
            .cast("q") for chunk in column.chunks if len(chunk)]


class Segments:
    """Publishes Arrow tables as raw Parquet segments named ``<writer>-<seq>``."""

    def __init__(self, data_dir: DataDir, writer_id: str, faults: Faults | None = None) -> None:
        self.data_dir = data_dir
        self.writer_id = writer_id
        self._seq = itertools.count()
        self._options = {s.folder: parquet_options(s.arrow_schema) for s in SIGNALS}
        self._faults = faults or Faults.from_env()

    def publish(self, signal: Signal, tables: list[pa.Table]) -> int:
        """Write ``tables`` split by hour of ``signal.time_column``; returns rows written."""
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if not table.num_rows:
            return 0
        # One dictionary per column for the whole segment: Parquet's writer materializes a
        # dictionary chunk whose dictionary differs from the first one (rows x size).
        table = table.unify_dictionaries()
        times = int64_views(table[signal.time_column])
        first = min(min(view) for view in times) // _HOUR_NS
        last = max(max(view) for view in times) // _HOUR_NS
        hours = [] if first == last else [t // _HOUR_NS for view in times for t in view]
        unique = [first] if first == last else sorted(set(hours))
        for hour in unique:
            # The common case is one hour: write the table as is, without a filtered copy.
            part = table if len(unique) == 1 else table.filter(
                pa.array([h == hour for h in hours]))
            path = self.data_dir.raw_segment_path(
                signal.folder, hour * _HOUR_NS, self.writer_id, next(self._seq))
            options = self._options[signal.folder]
            # A new date=/hour= folder must be in its parent before the file in it counts as
            # published (the sealed WAL is deleted after this): write_parquet_atomic fsyncs
            # only the folder it renames into. An object store has no folders: one PUT,
            # answered once the object is durable, publishes the segment.
            if not self.data_dir.remote:
                make_dirs_durable(path.parent)
            self._faults.check("publish")
            write_segment(part, path, options)
            self._faults.check("publish.after")
        return table.num_rows


class Sink:
    """The buffer between receivers and Parquet of one collector process."""

    def __init__(self, segments: Segments, wal: Wal, telemetry: Telemetry, *,
                 flush_rows: int, flush_interval_s: float, max_buffered_bytes: int) -> None:
        self.segments = segments
        self.wal = wal
        self.telemetry = telemetry
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.max_buffered_bytes = max_buffered_bytes
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._reset()
        #: Swapped batches whose publish failed, retried before anything newer.
        self._failed: list[tuple[dict[int, list[pa.Table]], list[Path], int]] = []
        self._failed_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flusher", daemon=True)

    def _reset(self) -> None:
        self._tables: dict[int, list[pa.Table]] = {s.code: [] for s in SIGNALS}
        self._rows = 0
        self._bytes = 0
        self._oldest = 0.0

    @property
    def buffered_bytes(self) -> int:
        return self._bytes + self._failed_bytes

    def start(self) -> None:
        self._thread.start()

    def accept(self, signal: Signal, received_ns: int, payload: bytes, table: pa.Table) -> None:
        """Make a request durable and buffer its rows; return only when the WAL is synced.

        Raises:
            Overloaded: the buffer is full (backpressure; the client retries).
            StorageFailure: the WAL write or fsync failed (nothing may be acknowledged).
        """
        if not table.num_rows:
            return  # everything was rejected: nothing to make durable
        size = table_bytes(table)
        if self.buffered_bytes + size > self.max_buffered_bytes:
            raise Overloaded(f"collector buffer full ({self.buffered_bytes} bytes); retry later")
        try:
            with self._lock:
                seq = self.wal.append(signal.code, received_ns, payload)
                if not self._rows:
                    self._oldest = time.monotonic()
                self._tables[signal.code].append(table)
                self._rows += table.num_rows
                self._bytes += size
            self.wal.sync(seq)
        except OSError as exc:
            self.telemetry.add("storage_failures")
            log.error("write-ahead log failed: %s", exc)
            raise StorageFailure(f"write-ahead log unavailable: {exc.strerror or exc}") from None
        self.telemetry.add("wal_bytes", len(payload))
        self.telemetry.set("queue_bytes", self.buffered_bytes)

    def _due(self) -> bool:
        if not self._rows:
            return bool(self._failed)
        age = time.monotonic() - self._oldest
        return self._rows >= self.flush_rows or age >= self.flush_interval_s or bool(self._failed)

    def _run(self) -> None:
        delay = POLL_S
        while not self._stop.wait(delay):
            if not self._due():
                continue
            try:
                published = self.flush()
            except Exception:  # e.g. sealing the WAL failed: keep the thread, retry later
                self.telemetry.add("flush_failures")
                log.exception("flush failed; will retry")
                published = False
            # Back off while publishing fails (a full disk, no free descriptors): each try
            # costs a Parquet encode and a log line, and does not make the disk any emptier.
            delay = POLL_S if published else min(RETRY_MAX_S, max(RETRY_FIRST_S, delay * 2))

    def flush(self) -> bool:
        """Publish everything buffered; True when nothing is left unpublished."""
        with self._flush_lock:
            with self._lock:
                if self._rows:
                    tables, size = self._tables, self._bytes
                    sealed = self.wal.rotate()
                    self._reset()
                    self._failed.append((tables, sealed, size))
                    self._failed_bytes += size
            while self._failed:
                tables, sealed, size = self._failed[0]
                try:
                    rows = sum(self.segments.publish(BY_CODE[code], batch)
                               for code, batch in tables.items() if batch)
                except OSError as exc:
                    self.telemetry.add("flush_failures")
                    log.error("publishing Parquet failed (will retry): %s", exc)
                    return False
                for path in sealed:
                    path.unlink(missing_ok=True)
                self._failed.pop(0)
                self._failed_bytes -= size
                self.telemetry.add("flushed_rows", rows)
                self.telemetry.add("flushed_segments", sum(1 for b in tables.values() if b))
            self.telemetry.set("queue_bytes", self.buffered_bytes)
            self.telemetry.set("wal_fsyncs", self.wal.fsyncs)
            return True

    def close(self) -> None:
        """Stop the flusher, publish what is left (retrying briefly) and close the WAL."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for _ in range(20):
            if self.flush():
                # Every frame is published: an empty WAL needs no replay.
                self.wal.close(remove=True)
                return
            time.sleep(0.25)
        log.error("could not publish buffered rows at shutdown; the WAL keeps them for replay")
        self.wal.close()
