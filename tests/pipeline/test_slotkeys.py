"""(GPU, slot) keys packed into one int64 for the energy attribution (issue 17): the same
key for the same pair in every frame, distinct keys for distinct pairs, and the same files as
the two-column keys."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetlens.pipeline import energy as en
from fleetlens.pipeline.slotkeys import GID, GK, SLOT, gpu_slot_key
from tests.pipeline.fleet import full_run_files, make_fleet

NS = 1_000_000_000
SLOT_NS = 10 * NS
T = 1_790_000_000 * NS


def test_keys_are_one_per_pair_across_frames() -> None:
    a = pl.DataFrame({GID: [0, 0, 3, 7], SLOT: [T, T + SLOT_NS, T, T + 5 * SLOT_NS]})
    b = pl.DataFrame({GID: [7, 3, 9], SLOT: [T + 5 * SLOT_NS, T, T - 2 * SLOT_NS]})
    key = gpu_slot_key(SLOT_NS, a, b)
    assert key is not None
    both = pl.concat([a, b]).with_columns(key)
    pairs = both.select(GID, SLOT, GK).unique()
    assert pairs.height == both.select(GID, SLOT).unique().height
    assert pairs.get_column(GK).n_unique() == pairs.height
    assert gpu_slot_key(SLOT_NS, a.clear(), b.clear()) is None


def test_numbers_too_large_to_pack_take_the_two_column_keys() -> None:
    wide = pl.DataFrame({GID: [0, 1 << 40], SLOT: [T, T + (1 << 30) * SLOT_NS]})
    assert gpu_slot_key(SLOT_NS, wide) is None
    assert gpu_slot_key(SLOT_NS, pl.DataFrame({GID: [-1], SLOT: [T]})) is None



def test_packed_and_two_column_keys_publish_the_same_files(tmp_path: Path, monkeypatch) -> None:
    fleet = make_fleet(seconds=2400, rps=1.0, hosts=3)
    runs = {}
    packed: list[bool] = []

    def spy(*args):
        key = gpu_slot_key(*args)
        packed.append(key is not None)
        return key

    for name, packing in (("packed", True), ("columns", False)):
        monkeypatch.setattr(en, "gpu_slot_key", spy if packing else lambda *_args: None)
        runs[name] = full_run_files(tmp_path / name, fleet)
    assert packed and all(packed)  # the packed keys were used
    assert runs["packed"] and runs["packed"] == runs["columns"]
