"""The pipeline's state in ``state/pipeline.json``: which raw segments were processed (with
each segment's event-time extent, so a rerun reads only the segments that overlap the hours it
recomputes), and each host's event-time watermark for the lateness rule.

The file is replaced atomically (tmp + fsync + rename) after the derived partitions of a run are
published, so a crash mid-run leaves the old state and the next run redoes the same work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fleetlens.pipeline.storage import DataDir, StorageError, write_json_atomic

STATE_FILE = "pipeline.json"
STATE_VERSION = 1


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

    @classmethod
    def load(cls, data_dir: DataDir) -> PipelineState:
        """The saved state, or an empty one when there is none yet.

        Raises:
            StateError: the file exists but is not a state this version wrote (edited by
                hand, or damaged); the message says how to rebuild it.
        """
        path = data_dir.state / STATE_FILE
        if not path.exists():
            return cls()
        try:
            raw = json.loads(path.read_text())
            if raw.get("version") != STATE_VERSION:
                return cls()
            return cls(
                segments={k: Segment(**v) for k, v in raw.get("segments", {}).items()},
                watermarks={k: int(v) for k, v in raw.get("watermarks", {}).items()},
                fingerprint=str(raw.get("fingerprint", "")),
            )
        except (ValueError, TypeError, AttributeError) as exc:  # JSON errors are ValueErrors
            raise StateError(
                f"{path} is unreadable ({type(exc).__name__}: {exc}); `fleetlens pipeline "
                "--full` rebuilds it (and every derived table) from the raw data") from None

    def save(self, data_dir: DataDir) -> Path:
        """Replace the state file atomically; keys are sorted so equal states are equal bytes."""
        body = {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "watermarks": dict(sorted(self.watermarks.items())),
            "segments": {k: vars(v) for k, v in sorted(self.segments.items())},
        }
        return write_json_atomic(data_dir.state / STATE_FILE, body)

    def files(self, signal: str, lo: int, hi: int, root: Path) -> list[str]:
        """Absolute paths of the known segments of ``signal`` overlapping ``[lo, hi)``."""
        return [
            str(root / rel) for rel, seg in sorted(self.segments.items())
            if seg.signal == signal and seg.overlaps(lo, hi)
        ]
