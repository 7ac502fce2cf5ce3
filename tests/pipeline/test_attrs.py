"""The distinct-value shortcut for JSON attribute maps gives exactly the whole-frame result."""

from __future__ import annotations

import json

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from fleetlens.pipeline.attrs import extract_keys, first_string_of_key, per_value
from fleetlens.pipeline.schema import attributes as a

_KEYS = {a.GEN_AI_INPUT_TOKENS: ("inp", pl.Int64()), a.ERROR_TYPE: ("err", pl.String())}
_MAPS = [
    None, "{}", json.dumps({a.GEN_AI_INPUT_TOKENS: 12}),
    json.dumps({a.GEN_AI_FINISH_REASONS: '["stop"]', a.ERROR_TYPE: "timeout"}),
    json.dumps({a.GEN_AI_FINISH_REASONS: ["length"], a.GEN_AI_INPUT_TOKENS: "x"}),
]


def _derive(frame: pl.DataFrame) -> pl.DataFrame:
    return extract_keys(frame, "m", _KEYS).with_columns(
        first_string_of_key("m", a.GEN_AI_FINISH_REASONS).alias("finish"))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(_MAPS), min_size=1, max_size=60))
def test_per_distinct_value_equals_whole_frame(maps: list[str | None]) -> None:
    frame = pl.DataFrame({"row": range(len(maps)), "m": maps}, schema={"row": pl.Int64,
                                                                       "m": pl.String})
    assert_frame_equal(per_value(frame, "m", _derive, always=True), _derive(frame))


def test_repeated_maps_take_the_shortcut_and_unique_ones_do_not() -> None:
    repeated = pl.DataFrame({"m": [_MAPS[3], _MAPS[2]] * 10_000})
    unique = pl.DataFrame({"m": [json.dumps({"i": i}) for i in range(20_000)]})
    calls: list[int] = []

    def counting(frame: pl.DataFrame) -> pl.DataFrame:
        calls.append(frame.height)
        return _derive(frame)

    assert_frame_equal(per_value(repeated, "m", counting), _derive(repeated))
    assert_frame_equal(per_value(unique, "m", counting), _derive(unique))
    assert calls == [2, 20_000]
