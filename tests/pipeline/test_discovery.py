"""Discovery's dirty hours equal the hours every on-time row touches, row by row, whether a
segment's rows start in one hour (the min/max shortcut) or in several (distinct triples); the
metrics shortcut of a first run gives exactly the row-by-row facts."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from fleetlens.pipeline.discovery import add_hours, event_rows, metric_facts, segment_facts
from fleetlens.pipeline.partitions import HOUR_NS
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir
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


@st.composite
def metric_segments(draw):
    """Metric points of two hosts (one host's may be null) in one hour or spread over three."""
    spread = draw(st.sampled_from([1, 1, 3]))
    n = draw(st.integers(0, 40))
    return pl.DataFrame({
        c.HOST_NAME: draw(st.lists(st.sampled_from(["a", "b", None]), min_size=n, max_size=n)),
        c.TS_NS: [T0 + draw(st.integers(0, spread * 3600 - 1)) * 10**9 for _ in range(n)],
        c.RECEIVED_NS: [T0] * n,
    }, schema={c.HOST_NAME: pl.String, c.TS_NS: pl.Int64, c.RECEIVED_NS: pl.Int64})


@settings(max_examples=150, deadline=None)
@given(metric_segments(), st.sampled_from([0, 10**9, 30 * 60 * 10**9]))
def test_metric_shortcut_equals_the_row_by_row_facts(tmp_path_factory, points, gap_ns) -> None:
    dd = DataDir(tmp_path_factory.mktemp("seg"))
    rel = "raw/metrics/seg.parquet"
    (dd.root / rel).parent.mkdir(parents=True)
    points.write_parquet(dd.root / rel)
    no_marks = pl.DataFrame(schema={c.HOST_NAME: pl.String, "mark": pl.Int64})
    want_stats, want_keys = segment_facts(
        event_rows(dd, "metrics", rel, no_marks, gap_ns, 0), "metrics")
    quick = metric_facts(dd, rel, gap_ns)
    starts = {ts // HOUR_NS for ts in points.get_column(c.TS_NS)}
    if len(starts) > 1:
        assert quick is None  # only the row-by-row path is exact then
        return
    assert quick is not None
    stats, keys = quick
    assert keys == want_keys
    assert_frame_equal(stats, want_stats, check_row_order=False)
