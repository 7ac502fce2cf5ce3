"""Failures end to end (issue 30): the simulator crashes, hangs and fails engines, loses a
host and silences an agent; a real collector, the pipeline and the analytics find each,
named with its subject, and the crashed engines' restarts too."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.accuracy import score_run
from fleetlens.analytics.failures.findings import DETECTOR_PREFIX
from fleetlens.pipeline.schema import FAILURE_CAUSES
from fleetlens.pipeline.schema import columns as c

INCIDENTS = [
    {"kind": "engine_down", "host": "h01", "service": "chat", "start_s": 600, "duration_s": 120},
    {"kind": "engine_hang", "host": "h02", "service": "chat", "start_s": 1000,
     "duration_s": 120},
    {"kind": "request_errors", "host": "h03", "service": "chat", "start_s": 1400,
     "duration_s": 240, "magnitude": 0.3},
    {"kind": "host_down", "host": "h05", "start_s": 1800, "duration_s": 180},
    {"kind": "telemetry_gap", "host": "h06", "start_s": 2200, "duration_s": 180},
]


@pytest.mark.slow
@pytest.mark.e2e
def test_each_failure_is_found_and_named_end_to_end(tmp_path) -> None:
    from bench.accuracy import fleet_doc, run_end_to_end

    doc = fleet_doc("failures", 2700, seed=5, incidents=INCIDENTS)
    truth, result, _ = run_end_to_end(doc, tmp_path)
    analysis = result.analysis
    score = score_run(truth["incidents"], analysis.incidents, analysis.causes)
    found = (analysis.causes.filter(pl.col(c.RANK) == 1)
             .join(analysis.incidents, on=c.INCIDENT_ID)
             .select(c.CAUSE, c.SUBJECT, c.START_NS, c.DETECTOR).sort(c.START_NS))
    notes = "\n".join(score.misses) + f"\n{found}"
    assert {g["cause"] for g in truth["incidents"]} == {
        "engine_down", "engine_restart", "engine_hang", "request_errors", "host_down",
        "telemetry_gap"}
    assert score.detected == score.injected, notes
    assert score.top1 == score.injected, notes
    assert score.subject == score.injected, notes
    assert score.false_incidents == 0, notes
    # nothing but the injected failures is a failure: the failure detectors found each once
    detected = found.filter(pl.col(c.DETECTOR).str.starts_with(DETECTOR_PREFIX))
    assert detected.height == len(truth["incidents"]), notes
    # a latency incident that names a failure (the hung engine's requests waiting: the
    # warm-up band judges a host's medians from its 6th minute) names an injected one, on
    # its subject, from the window it began in to just after it ended
    named = found.filter(~pl.col(c.DETECTOR).str.starts_with(DETECTOR_PREFIX)
                         & pl.col(c.CAUSE).is_in(list(FAILURE_CAUSES)))
    for row in named.iter_rows(named=True):
        assert any(g["cause"] == row[c.CAUSE] and g["subject"] == row[c.SUBJECT]
                   and g["start_ns"] - 60 * 10**9 <= row[c.START_NS]
                   <= g["end_ns"] + 120 * 10**9
                   for g in truth["incidents"]), notes
