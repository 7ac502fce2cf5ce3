"""String keys packed into one int64 (issue 17, session 8): the energy groups' dense rank and
the engine instances of the windows stage. The packed key must partition and order rows as
the tuple of the strings' codes does (nulls a value of their own, first), so ranks, windows
and group-bys over it give what they gave over the strings, and the files stay the same."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from fleetlens.pipeline import attrs
from fleetlens.pipeline import energy as en
from fleetlens.pipeline import windows as win
from fleetlens.pipeline.attrs import code, packed_codes
from fleetlens.pipeline.schema import columns as c
from tests.pipeline.fleet import full_run_files, make_fleet

NS = 1_000_000_000
T = 1_790_000_000 * NS


def _strings() -> pl.DataFrame:
    return pl.DataFrame({
        "a": ["x", "y", None, "x", "y", None, "zz", "x"],
        "b": ["p", None, "p", "p", "q", None, "q", None],
    })


def test_equal_keys_exactly_for_equal_rows_nulls_included() -> None:
    frame = _strings()
    key = packed_codes(frame, ["a", "b"])
    assert key is not None and key.dtype == pl.Int64
    both = frame.with_columns(key.alias("k"))
    assert both.select("a", "b").unique().height == both.get_column("k").n_unique()
    pairs = both.unique(["a", "b", "k"])
    assert pairs.height == pairs.get_column("k").n_unique()  # one key per pair, nulls too


def test_keys_rank_as_the_struct_of_codes() -> None:
    frame = _strings()
    key = packed_codes(frame, ["a", "b"])
    assert key is not None
    # the same cast for both sides: the ranks compare what each would compute
    ranked = frame.with_columns(
        pl.struct(code("a"), code("b")).rank("dense").alias("struct"),
        pl.lit(key).rank("dense").alias("packed"))
    assert ranked.get_column("struct").to_list() == ranked.get_column("packed").to_list()


def test_too_many_bits_give_none(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = pl.DataFrame({"a": ["x", "y"], "b": ["p", "q"]})
    huge = pl.lit(1 << 40, pl.Int64)
    monkeypatch.setattr(attrs, "code", lambda _column: huge)
    assert packed_codes(wide, ["a", "b"]) is None


def _engine() -> pl.DataFrame:
    """Two hours' worth of engine samples of three instances on two hosts (one instance name
    on both hosts, one host null), counters with a restart, in partition order (host,
    instance, time per hour, the two hours one after the other)."""
    rows = []
    for hour in range(2):
        for host, inst in (("h1", "i1"), ("h1", "i2"), ("h2", "i1"), (None, "i3")):
            for s in range(0, 3600, 30):
                ts = T + hour * 3600 * NS + s * NS
                n = hour * 120 + s // 30
                rows.append({c.TS_NS: ts, c.HOST_NAME: host, c.INSTANCE_ID: inst, c.MODEL: "m",
                             c.KV_CACHE_USAGE: (n % 17) / 17,
                             c.PREFIX_CACHE_HITS_TOTAL: float(n * 3 if n < 150 else n - 150),
                             c.PREFIX_CACHE_QUERIES_TOTAL: float(n * 5),
                             c.PREEMPTIONS_TOTAL: float(n // 10)})
    return pl.DataFrame(rows)


def test_engine_window_stats_equal_the_string_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()
    packed = win.engine_window_stats(engine, 60)
    monkeypatch.setattr(win, "packed_codes", lambda *_args: None)
    strings = win.engine_window_stats(engine, 60)
    order = [c.WINDOW_START_NS, c.HOST_NAME, c.MODEL]
    assert packed.sort(order, nulls_last=True).equals(strings.sort(order, nulls_last=True))
    assert packed.height > 100



def test_packed_and_string_keys_publish_the_same_files(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = make_fleet(seconds=2400, rps=1.0, hosts=3)
    runs = {}
    used: list[bool] = []

    def spy(*args):
        key = packed_codes(*args)
        used.append(key is not None)
        return key

    for name, packing in (("packed", True), ("strings", False)):
        fake = spy if packing else (lambda *_args: None)
        monkeypatch.setattr(en, "packed_codes", fake)
        monkeypatch.setattr(win, "packed_codes", fake)
        runs[name] = full_run_files(tmp_path / name, fleet)
    assert used and all(used)  # the packed keys were used
    assert runs["packed"] and runs["packed"] == runs["strings"]
