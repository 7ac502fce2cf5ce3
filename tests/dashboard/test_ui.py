"""How the pages show numbers: latencies in the unit that reads best, tables without raw ns."""

from __future__ import annotations

import datetime as dt

import polars as pl

from fleetlens.dashboard.ui import duration, readable, versus


def test_durations_read_in_ms_below_a_second_and_in_s_above() -> None:
    assert [duration(v) for v in (0.0041, 0.0123, 0.85, 2.108, 9.7747, 313.178, None)] == [
        "4.1 ms", "12 ms", "850 ms", "2.11 s", "9.77 s", "313 s", "n/a"]


def test_tables_show_times_as_utc_datetimes_and_round_floats() -> None:
    frame = pl.DataFrame({"arrival_ns": [1_790_000_000_123_456_789], "e2e_s": [19.78561234],
                          "request_id": ["r1"], "output_tokens": [12]})
    out = readable(frame)
    assert out.schema["arrival_ns"] == pl.Datetime("ms", "UTC")
    assert out["arrival_ns"][0] == dt.datetime(2026, 9, 21, 14, 13, 20, 123000, tzinfo=dt.UTC)
    assert out["e2e_s"][0] == 19.79
    assert out["request_id"][0] == "r1" and out["output_tokens"][0] == 12  # untouched


def test_a_value_against_its_expected_level() -> None:
    assert [versus(*pair) for pair in ((1.35, 1.0), (0.5, 1.0), (239.4, 0.0189), (1.0, 0.0),
                                       (None, 1.0))] == ["+35%", "-50%", "x12,667", None, None]
