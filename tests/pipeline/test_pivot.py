"""The fast paths of the samples stages: packed source codes, the sorted pivot, dictionary reads.

Each fast path is checked against its general path (or the String input) on the same data, so a
shortcut can never change what the stages produce."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fleetlens.pipeline import attrs, partitions, pivot
from fleetlens.pipeline.partitions import read_raw
from fleetlens.pipeline.pivot import KEY, SLOT, SRC, pivot_sorted, split_sources
from fleetlens.pipeline.runner import _CATEGORICAL, _COLUMNS
from fleetlens.pipeline.samples import engine_samples, gpu_samples, instance_gpus
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.rawdata import (
    NS,
    T0,
    engine_point,
    gpu_points,
    instance_gpu_point,
    point,
    points_frame,
    write_raw,
)

_CAT = list(_CATEGORICAL["metrics"])


def _mixed_points() -> pl.DataFrame:
    """Two hosts, three GPUs (one with a power-only history, one with a duplicate delivery and
    a point at its own timestamp), an engine instance with a percent gauge and a vLLM alias,
    the instance mapping, a null host and an unrelated metric."""
    rows = []
    for k in range(6):
        ts = T0 + k * NS // 10
        rows += gpu_points("GPU-a", ts, power=100 + k, energy=1000.0 + 10 * k)
        rows += gpu_points("GPU-b", ts, power=200 + k, energy=None, index=1)
        rows += gpu_points("GPU-c", ts + 7, power=300 + k, energy=50.0 * k, host="h2")
        rows.append(engine_point(a.ENGINE_KV_CACHE_USAGE, "i1", ts, 40.0 + k))
        rows.append(instance_gpu_point("i1", "GPU-a", ts))
    rows[-1] = {**rows[-1], c.UNIT: "%"}  # one percent-valued point
    rows += gpu_points("GPU-a", T0 + 2 * NS // 10, power=999.0, energy=1020.0)  # duplicate
    rows.append(point(a.HW_POWER, T0 + 55, 5.0, attrs={a.HW_ID: "GPU-a"}, unit="kW"))
    rows.append(point(a.VLLM_PROMETHEUS_NAMES[a.ENGINE_NUM_RUNNING][0], T0, 3.0,
                      attrs={a.ENGINE_INSTANCE: "i1", a.ENGINE_MODEL_NAME: "m1"}))
    rows.append(point("something.else", T0, 1.0))
    rows.append({**point(a.HW_POWER, T0, 7.0, attrs={a.HW_ID: "GPU-z"}), c.HOST_NAME: None})
    return points_frame(rows)


def test_split_sources_codes_each_combination_once_and_keeps_nulls() -> None:
    points = _mixed_points()
    slim, combos = split_sources(points, [c.TS_NS, c.VALUE])
    assert slim.columns == [c.TS_NS, c.VALUE, SRC] and slim.height == points.height
    distinct = points.select(pivot.SOURCE).unique().height
    assert combos.height == distinct == slim.get_column(SRC).n_unique()
    # every point's code leads back to its own strings, nulls included
    back = slim.join(combos, on=SRC, how="left", maintain_order="left")
    assert_frame_equal(back.select(pivot.SOURCE), points.select(pivot.SOURCE))
    assert combos.filter(pl.col(c.HOST_NAME).is_null()).height == 1


def test_split_sources_falls_back_when_codes_do_not_pack(monkeypatch) -> None:
    points = _mixed_points()
    packed = split_sources(points, [c.TS_NS])
    monkeypatch.setattr(attrs, "PACK_BITS", 0)
    numbered = split_sources(points, [c.TS_NS])
    # different code values, same partition of the points into combinations
    for slim, combos in (packed, numbered):
        assert slim.get_column(SRC).n_unique() == combos.height
    pairs = pl.DataFrame({"p": packed[0][SRC], "n": numbered[0][SRC]}).unique()
    assert pairs.height == packed[1].height


def test_pivot_sorted_side_by_side_duplicates_and_unequal_keys() -> None:
    frame = pl.DataFrame({SLOT: [0, 1, 0, 1, 0, 0, 1], "k": [3, 3, 1, 1, 2, 2, 5],
                          c.VALUE: [30.0, 31.0, 10.0, 11.0, 20.0, 25.0, 51.0]})
    out = pivot_sorted(frame, ["x", "y"], pl.col("k"))
    expected = pl.DataFrame({KEY: [1, 2, 3, 5], "x": [10.0, 25.0, 30.0, None],
                             "y": [11.0, None, 31.0, 51.0]})
    assert_frame_equal(out, expected)
    same_keys = frame.filter(pl.col("k") != 2).filter(pl.col("k") != 5)
    assert_frame_equal(pivot_sorted(same_keys, ["x", "y"], pl.col("k")),
                       expected.filter(pl.col(KEY).is_in([1, 3])))
    assert pivot_sorted(frame.clear(), ["x"], pl.col("k")).columns == [KEY, "x"]


@pytest.mark.parametrize("stage", [gpu_samples, engine_samples, instance_gpus],
                         ids=["gpu_samples", "engine_samples", "instance_gpus"])
def test_stages_give_the_same_rows_from_categorical_columns(stage) -> None:
    points = _mixed_points()
    args = (60.0,) if stage is gpu_samples else ()
    as_strings = stage(points, *args)
    as_codes = stage(points.with_columns(pl.col(_CAT).cast(pl.Categorical)), *args)
    assert as_strings.height > 0
    assert_frame_equal(as_codes, as_strings)


def test_gpu_samples_pivot_matches_the_long_span_path() -> None:
    # Points more than 2.4 hours apart take the two-column grouping: same rows as packed.
    points = _mixed_points()
    later = points.with_columns(pl.col(c.TS_NS) + 3 * 3600 * NS)
    both = gpu_samples(pl.concat([points, later]), 60.0)
    first = gpu_samples(points, 60.0)
    assert_frame_equal(both.filter(pl.col(c.TS_NS) < T0 + 3600 * NS), first)
    assert both.height == 2 * first.height


def test_read_raw_dictionary_columns_match_the_string_read(tmp_path) -> None:
    dd = DataDir(tmp_path)
    points = _mixed_points()
    write_raw(dd, t.METRIC_POINTS, points.head(40), seq=1)
    # an older segment without the temporality column: read as nulls
    write_raw(dd, t.METRIC_POINTS, points.slice(40).drop(c.TEMPORALITY), seq=2)
    files = sorted(str(p) for p in (tmp_path / "raw").rglob("*.parquet"))
    keep = pl.col(c.TS_NS) >= T0 + NS // 10
    plain = read_raw(files, t.METRIC_POINTS, keep, _COLUMNS["metrics"])
    coded = read_raw(files, t.METRIC_POINTS, keep, _COLUMNS["metrics"], tuple(_CAT))
    assert all(coded.schema[n] == pl.Categorical for n in _CAT)
    assert_frame_equal(coded.with_columns(pl.col(_CAT).cast(pl.String)), plain)
    assert plain.get_column(c.TEMPORALITY).null_count() > 0


@pytest.mark.parametrize("batch_rows", [1, 30, 10**9])
def test_read_raw_dictionaries_batches_segments_of_mixed_columns(tmp_path, monkeypatch,
                                                                 batch_rows) -> None:
    # Collector-sized segments are cast and filtered a batch at a time: any batch boundary,
    # with and without the temporality column in the batch, gives the plain read's rows.
    monkeypatch.setattr(partitions, "_BATCH_ROWS", batch_rows)
    dd = DataDir(tmp_path)
    points = _mixed_points()
    step = -(-points.height // 5)
    for seq, lo in enumerate(range(0, points.height, step)):
        piece = points.slice(lo, step)
        write_raw(dd, t.METRIC_POINTS, piece.drop(c.TEMPORALITY) if seq % 2 else piece, seq=seq)
    files = sorted(str(p) for p in (tmp_path / "raw").rglob("*.parquet"))
    assert len(files) == 5
    keep = pl.col(c.TS_NS) >= T0 + NS // 10
    plain = read_raw(files, t.METRIC_POINTS, keep, _COLUMNS["metrics"])
    coded = read_raw(files, t.METRIC_POINTS, keep, _COLUMNS["metrics"], tuple(_CAT))
    assert all(coded.schema[n] == pl.Categorical for n in _CAT)
    assert_frame_equal(coded.with_columns(pl.col(_CAT).cast(pl.String)), plain)
