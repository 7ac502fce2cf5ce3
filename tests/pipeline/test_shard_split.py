"""A sharded hour reads each raw segment once (:mod:`pipeline.shardsplit`): the split gives
every shard the rows, in the order, that reading every segment with its filter gives."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace

import polars as pl

from fleetlens.pipeline import phases
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.discovery import discover
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.shards import plan
from fleetlens.pipeline.shardsplit import Chunk, Spill, chunks, segment_rows, shard_rows
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.fleet import write_batches
from tests.pipeline.rawdata import NS
from tests.pipeline.test_shards import fleet  # noqa: F401 - the module's fixture

HOUR = 3600 * NS


def _hour(tmp_path, fleet):  # noqa: F811 - the fixture
    dd = DataDir(tmp_path / "data")
    write_batches(dd, fleet)
    state, cfg = PipelineState(), PipelineConfig()
    discover(dd, state, int(cfg.max_sample_gap_s * NS), cfg.lateness_s * NS)
    hour = max(s.min_ns - s.min_ns % HOUR for s in state.segments.values())
    return dd, state, cfg, hour


def test_split_rows_are_the_shards_filtered_reads(tmp_path, fleet) -> None:  # noqa: F811
    """Each shard's pieces, concatenated, equal its own filtered read of every segment, for
    points (by host, unknown and null hosts in the last shard) and spans (by trace)."""
    dd, state, cfg, hour = _hour(tmp_path, fleet)
    files = phases.phase1_files(state, dd, cfg, hour)
    shards = plan([h for h in state.watermarks if h != "h3"], 3)  # h3: a host no plan names
    assert len(shards) == 4
    with Spill(shards) as spill:
        for chunk in chunks(files, segment_rows(state, dd.root), {"metrics": 2, "spans": 2}):
            spill.add(chunk.signal, phases.split_chunk(cfg, chunk, hour, shards))
        for shard in shards:
            for signal in ("metrics", "spans"):
                want = phases.read_rows(cfg, signal, files[signal], hour, shard)
                got = shard_rows(spill.pieces(signal, shard.index))
                assert got is not None and got.equals(want), (signal, shard.index)


def test_a_sharded_hour_reads_each_segment_once(tmp_path, fleet, monkeypatch) -> None:  # noqa: F811
    """Before the split, every shard read every segment of its hour (the fleet's rows times
    the shards); now each segment is read once, and the outputs are what one shard gives."""
    dd, state, cfg, hour = _hour(tmp_path, fleet)
    files = phases.phase1_files(state, dd, cfg, hour)
    reads: Counter[str] = Counter()
    real = phases.read_raw

    def counting(paths, *args, **kwargs):
        reads.update(paths)
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(phases, "read_raw", counting)
    shards = plan(list(state.watermarks), 2)
    assert len(shards) >= cfg.split_from_shards
    sharded = phases.phase1_hour(cfg, files, hour, shards, segment_rows(state, dd.root))
    assert set(reads) == set(files["metrics"]) | set(files["spans"])
    assert set(reads.values()) == {1}
    whole = phases.phase1_hour(cfg, files, hour)
    assert [n for n, _ in sharded] == [n for n, _ in whole]
    for (_, got), (_, want) in zip(sharded, whole, strict=True):
        assert got.equals(want)
    # Below split_from_shards (the split costs more than a few shards' own reads) each shard
    # reads every segment itself, to the same outputs.
    reads.clear()
    few = phases.phase1_hour(replace(cfg, split_from_shards=len(shards) + 1), files, hour,
                             shards, segment_rows(state, dd.root))
    assert set(reads.values()) == {len(shards)}
    for (_, got), (_, want) in zip(few, whole, strict=True):
        assert got.equals(want)


def test_chunks_keep_segment_order_and_size() -> None:
    files = {"metrics": ["m1", "m2", "m3", "m4"], "spans": ["s1"]}
    rows = {"m1": 4, "m2": 5, "m3": 20, "m4": 1, "s1": 3, "s2": 3}.__getitem__
    limits = {"metrics": 10, "spans": 5}
    assert chunks(files | {"spans": ["s1", "s2"]}, rows, limits) == [
        Chunk("metrics", ("m1", "m2")), Chunk("metrics", ("m3",)), Chunk("metrics", ("m4",)),
        Chunk("spans", ("s1",)), Chunk("spans", ("s2",))]
    assert chunks({"metrics": [], "spans": []}, rows) == []
    # rows unknown: a segment is a chunk of its own
    assert chunks(files, None) == [Chunk("metrics", (f,)) for f in files["metrics"]] + [
        Chunk("spans", ("s1",))]


def test_shard_of_matches_every_shard_filter() -> None:
    """One pass over the rows gives each the shard whose filter takes it."""
    from fleetlens.pipeline.shardsplit import shard_of

    shards = plan([f"h{i}" for i in range(7)], 2)
    points = pl.DataFrame({c.HOST_NAME: ["h0", "h6", None, "new", "h3", "h1", "h5"]}).with_columns(
        pl.col(c.HOST_NAME).cast(pl.Categorical))
    index = points.select(shard_of("metrics", shards)).to_series().to_list()
    for row, shard in enumerate(index):
        taken = [s.index for s in shards
                 if points.slice(row, 1).filter(s.point_filter()).height]
        assert taken == [shard]
    spans = pl.DataFrame({c.TRACE_ID: [f"{i:032x}" for i in range(50)] + ["zz", None]})
    index = spans.select(shard_of("spans", shards)).to_series().to_list()
    for row, shard in enumerate(index):
        taken = [s.index for s in shards if spans.slice(row, 1).filter(s.span_filter()).height]
        assert taken == [shard]


def test_a_dead_runners_scratch_is_removed_by_the_next(tmp_path, monkeypatch) -> None:
    """A local runner killed mid-hour leaves its pieces (an hour of raw rows) behind; the next
    split removes them, and not those of a live process."""
    import subprocess
    import sys
    import tempfile

    from fleetlens.pipeline.shardsplit import remove_orphans

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan = tmp_path / f"fleetlens-shards-{dead}-abc"
    alive = tmp_path / "fleetlens-shards-1-def"  # init: alive, not ours to signal
    other = tmp_path / "fleetlens-shards-x-ghi"
    for folder in (orphan, alive, other):
        (folder / "metrics-0-0.arrow").parent.mkdir()
        (folder / "metrics-0-0.arrow").write_bytes(b"x")
    with Spill(plan(["a", "b"], 1)):
        assert not orphan.exists() and alive.exists() and other.exists()
        mine = next(tmp_path.glob(f"fleetlens-shards-{os.getpid()}-*"))
        assert remove_orphans(tmp_path) == [] and mine.exists()
    assert not mine.exists()
