"""Discovery's dirty hours equal the hours every on-time row touches, row by row, whether a
segment's rows start in one hour (the min/max shortcut) or in several (distinct triples)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.discovery import add_hours, segment_facts
from pipeline.partitions import HOUR_NS
from pipeline.schema import columns as c
from tests.pipeline.rawdata import T0

MIN = 60 * 10**9


@st.composite
def segments(draw):
    """Event rows (lo <= hi, back <= lo) starting in one hour or spread over several."""
    spread = draw(st.sampled_from([1, 3]))
    rows = []
    for _ in range(draw(st.integers(1, 30))):
        lo = T0 + draw(st.integers(0, spread * 60 - 1)) * MIN
        rows.append({c.HOST_NAME: draw(st.sampled_from(["a", "b"])), "lo": lo,
                     "hi": lo + draw(st.integers(0, 150)) * MIN,
                     "back": lo - draw(st.sampled_from([0, 1])) * MIN,
                     "end": lo, "received": lo, "late": draw(st.booleans())})
    return pl.DataFrame(rows)


@settings(max_examples=200, deadline=None)
@given(segments())
def test_dirty_hours_are_exactly_those_the_rows_touch(rows) -> None:
    _stats, keys = segment_facts(rows, "metrics")
    dirty: set[int] = set()
    energy: set[int] = set()
    add_hours(keys, dirty, energy)
    want: set[int] = set()
    want_energy: set[int] = set()
    for lo, hi, back in rows.filter(~pl.col("late")).select("lo", "hi", "back").iter_rows():
        first = lo - lo % HOUR_NS
        want.update(range(first, hi - hi % HOUR_NS + HOUR_NS, HOUR_NS))
        want_energy.update(range(back - back % HOUR_NS, first, HOUR_NS))
    assert dirty == want
    assert energy == want_energy
