"""The pipeline's state in ``state/pipeline.json``: which raw segments were processed (with
each segment's event-time extent, so a rerun reads only the segments that overlap the hours it
recomputes), and each host's event-time watermark for the lateness rule.

The file is replaced atomically (tmp + fsync + rename) after the derived partitions of a run are
published, so a crash mid-run leaves the old state and the next run redoes the same work.

On an object store the state is one object replaced with a conditional PUT: ``If-Match`` the
version it was loaded at (``If-None-Match: *`` when there was none). Its writers hold the job
lease, so a conflict means the lease was lost to another job (expired while this one was
stalled): the save then fails instead of overwriting that job's state, and this run's outputs
are redone by the next run, as after a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fleetlens.pipeline.storage import (
    DataDir,
    StorageError,
    VersionConflict,
    fence,
    is_remote,
    write_json_atomic,
)

STATE_FILE = "pipeline.json"
STATE_VERSION = 1
#: Per state object: the version this process last read or wrote (a state made afresh, e.g.
#: for ``--full``, replaces that version, not whatever is there by then).
_SEEN: dict[str, str | None] = {}


class StateError(StorageError):
    """``state/pipeline.json`` cannot be read."""


@dataclass(frozen=True)
class Segment:
    """One raw Parquet segment as the pipeline last saw it."""

    signal: str
    size: int
    min_ns: int
    max_ns: int
    rows: int

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether any event time of the segment may fall in ``[lo, hi)``."""
        return self.rows > 0 and self.min_ns < hi and self.max_ns >= lo


@dataclass
class PipelineState:
    """Processed segments (path relative to the data dir -> extent) and host watermarks."""

    segments: dict[str, Segment] = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)
    fingerprint: str = ""
    #: The object version this state was loaded at (object stores only; None: no object).
    version: str | None = field(default=None, compare=False, repr=False)
    #: Whether ``version`` was read (False: a state made afresh, see :data:`_SEEN`).
    loaded: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def load(cls, data_dir: DataDir) -> PipelineState:
        """The saved state, or an empty one when there is none yet.

        Raises:
            StateError: the file exists but is not a state this version wrote (edited by
                hand, or damaged); the message says how to rebuild it.
        """
        path = data_dir.state / STATE_FILE
        version = None
        if is_remote(path):  # one GET, which also gives the version to save against
            try:
                body, version = path.read_versioned()  # type: ignore[union-attr]
            except FileNotFoundError:
                _SEEN[str(path)] = None
                return cls(loaded=True)
            _SEEN[str(path)] = version
        elif not path.exists():
            return cls()
        else:
            body = path.read_bytes()
        try:
            raw = json.loads(body)
            if raw.get("version") != STATE_VERSION:
                return cls(version=version, loaded=version is not None)
            return cls(
                segments={k: Segment(**v) for k, v in raw.get("segments", {}).items()},
                watermarks={k: int(v) for k, v in raw.get("watermarks", {}).items()},
                fingerprint=str(raw.get("fingerprint", "")),
                version=version,
                loaded=version is not None,
            )
        except (ValueError, TypeError, AttributeError) as exc:  # JSON errors are ValueErrors
            raise StateError(
                f"{path} is unreadable ({type(exc).__name__}: {exc}); `fleetlens pipeline "
                "--full` rebuilds it (and every derived table) from the raw data") from None

    def save(self, data_dir: DataDir) -> Path:
        """Replace the state file atomically; keys are sorted so equal states are equal bytes.

        Raises:
            StateError: on an object store, another writer replaced the state since it was
                loaded (nothing is overwritten).
            LeaseLost: on an object store, this job lost its lease (nothing is written).
        """
        body = {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "watermarks": dict(sorted(self.watermarks.items())),
            "segments": {k: vars(v) for k, v in sorted(self.segments.items())},
        }
        path = data_dir.state / STATE_FILE
        if not is_remote(path):
            return write_json_atomic(path, body)
        data = json.dumps(body, indent=1, sort_keys=True).encode()
        key = str(path)
        if self.loaded:
            expected = self.version
        elif key in _SEEN:
            expected = _SEEN[key]
        else:  # never read here: replace what is there now (the caller holds the job lease)
            expected = path.current_version()  # type: ignore[union-attr]
        fence.check(path)  # a job that lost its lease says so, not "replaced by another job"
        try:
            self.version = _SEEN[key] = path.put_if(data, expected)  # type: ignore[union-attr]
            self.loaded = True
        except VersionConflict:
            raise StateError(
                f"{path} was replaced by another job since this one read it (the job lease "
                "expired?); nothing was overwritten, the next run redoes this one") from None
        return path

    def files(self, signal: str, lo: int, hi: int, root: Path) -> list[str]:
        """Absolute paths of the known segments of ``signal`` overlapping ``[lo, hi)``."""
        return [
            str(root / rel) for rel, seg in sorted(self.segments.items())
            if seg.signal == signal and seg.overlaps(lo, hi)
        ]
