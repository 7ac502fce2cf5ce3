"""`incident_phases`, `incident_dimensions`, `incident_periods` (issue 32): what the causes
were ranked on, lifted from their evidence; the webhook body carries the same rows."""

from __future__ import annotations

import json

import polars as pl
import pytest

from fleetlens.analytics.incident_facts import incident_tables
from fleetlens.analytics.webhook_formats import native_body
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema import validate

BASE_START, BASE_END = 1_790_000_000_123_456_789, 1_790_000_900_123_456_789
SPLIT = {"queue": (4.0, 0.01), "prefill": (-2.0, 0.0), "decode": (370.0, 0.99),
         "overhead": (0.0, 0.0)}


def _evidence() -> str:
    return json.dumps({
        "phases": {p: {"excess_ms": ms, "share": share} for p, (ms, share) in SPLIT.items()},
        "requests": {"incident": 120, "baseline": 3625},
        "baseline_period_ns": {"start": BASE_START, "end": BASE_END},
        "top_dimensions": [
            {"dimension": "host_name", "value": "h01", "lift": 3.5, c.SHARE_OF_EXCESS: 0.8},
            {"dimension": "prompt_bucket", "value": "0-512", "lift": None,
             c.SHARE_OF_EXCESS: 0.1}],
        "signals": {}})


def _tables() -> tuple[pl.DataFrame, pl.DataFrame]:
    incidents = pl.DataFrame({c.INCIDENT_ID: ["a", "b"], c.START_NS: [BASE_END + 1, 5],
                              c.END_NS: [BASE_END + 2, 6]})
    # a: a failure set it off and ranks first with no phases; b: a failure, nothing split
    causes = pl.DataFrame({
        c.INCIDENT_ID: ["a", "a", "b"], c.RANK: [1, 2, 1],
        c.CAUSE: ["engine_down", "kv_cache_pressure", "engine_down"], c.SUBJECT: ["s"] * 3,
        c.SCORE: [1.0, 0.5, 1.0], c.SHARE_OF_EXCESS: [None, 1.0, None],
        c.EVIDENCE: [json.dumps({"down_s": 60}), _evidence(), json.dumps({"down_s": 5})],
        c.SUMMARY: ["", "", ""]}, schema=t.table(t.CAUSES).schema)
    return incidents, causes


def test_the_split_the_causes_were_ranked_on_becomes_rows() -> None:
    incidents, causes = _tables()
    got = incident_tables(incidents, causes)
    for name, frame in got.items():
        validate(frame, name)
    phases = got[t.INCIDENT_PHASES]
    assert phases[c.INCIDENT_ID].unique().to_list() == ["a"]  # b has nothing to show
    assert phases[c.PHASE].to_list() == list(SPLIT)
    assert phases[c.EXCESS_S].to_list() == pytest.approx([ms / 1000 for ms, _ in SPLIT.values()])
    assert phases[c.SHARE].to_list() == [share for _, share in SPLIT.values()]
    dims = got[t.INCIDENT_DIMENSIONS]
    assert dims.select(c.RANK, c.DIMENSION, c.DIMENSION_VALUE).rows() == [
        (1, "host_name", "h01"), (2, "prompt_bucket", "0-512")]
    assert dims[c.LIFT].to_list() == [3.5, None]
    period = got[t.INCIDENT_PERIODS].row(0, named=True)
    # nanoseconds exact (a float would have rounded them to ~100 ns)
    assert (period[c.BASELINE_START_NS], period[c.BASELINE_END_NS]) == (BASE_START, BASE_END)
    assert (period[c.INCIDENT_REQUESTS], period[c.BASELINE_REQUESTS]) == (120, 3625)


def test_the_webhook_body_carries_the_stored_phases() -> None:
    incidents, causes = _tables()
    stored = incident_tables(incidents, causes)[t.INCIDENT_PHASES]
    body = native_body(incidents.row(0, named=True), causes)
    assert body["phases"] == stored.drop(c.INCIDENT_ID).to_dicts()
    assert native_body(incidents.row(1, named=True), causes)["phases"] == []
