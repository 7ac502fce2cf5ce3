"""Issue 15: what supports a decode-side or tail incident (analytics/confirm.py).

A straggler's TPOT tail is supported by its peers (random seed 17, fleet 17006:
one slow GPU of four instances on an H200 host lifted the host's TPOT p99 x1.9 and the
instance's TPOT x1.3 against its peers; the slow-GPU rule scored 0.10 (its share of the
host's excess) and the mean end-to-end rose under 5%, so the incident was withheld).

A prefix-cache drop's score does not support a TPOT incident (random seed 20, fleet 20005:
replayed bursts of new conversations with short answers lifted a host's TPOT p99 x2.7-6.8
while the hit rate fell 48% -> 28%; named prefix_cache_drop at 0.20-0.25 with the mean
end-to-end down 24-31%: three false incidents).

The stage is checked on the frames it takes: an incident, its top cause and the anomalies
it was merged from."""

from __future__ import annotations

import json

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.confirm import withhold_unsupported
from fleetlens.analytics.detect import ANOMALY_COLUMNS
from fleetlens.analytics.merge import incidents_frame
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

from .conftest import NS, T0

MIN = 60 * NS
SCOPE = {c.SERVICE_NAME: "svc1a", c.MODEL: "llama", c.LEVEL: "host"}


def _incident(metric: str = "tpot_p99_s") -> pl.DataFrame:
    return incidents_frame([{
        c.INCIDENT_ID: "i1", c.METRIC: metric, **SCOPE, c.HOST_NAME: "h02",
        c.START_NS: T0, c.END_NS: T0 + 13 * MIN, c.PEAK: 0.0067, c.EXPECTED: 0.0035,
        c.SEVERITY: "major", c.DETECTOR: "band", c.DETECTED_NS: T0 + 3 * MIN,
    }])


def _causes(score: float = 0.10, cause: str = "slow_gpu", e2e: float = 4.12) -> pl.DataFrame:
    evidence = json.dumps({"e2e_mean_s": {"baseline": 4.00, "incident": e2e}})  # +3%
    return pl.DataFrame([{
        c.INCIDENT_ID: "i1", c.RANK: 1, c.CAUSE: cause, c.SUBJECT: "gpu_uuid=GPU-1",
        c.SCORE: score, c.SHARE_OF_EXCESS: 0.2, c.EVIDENCE: evidence, c.SUMMARY: "",
    }], schema=t.table(t.CAUSES).columns)


def _anomaly(metric: str, host: str = "h02", start_min: int = 1) -> dict:
    return {
        c.SERIES: f"{metric}{{host_name={host}}}", c.METRIC: metric, **SCOPE,
        c.HOST_NAME: host, c.START_NS: T0 + start_min * MIN,
        c.END_NS: T0 + (start_min + 12) * MIN, c.PEAK: 1.3, c.EXPECTED: 1.0,
        c.DETECTED_NS: T0 + (start_min + 3) * MIN, c.DETECTOR: "band", c.REQUESTS: 900,
    }


def _kept(anomalies: list[dict], config: AnalyticsConfig | None = None) -> list[str]:
    frame = pl.DataFrame(anomalies, schema={k: None for k in ANOMALY_COLUMNS}) \
        if anomalies else None
    incidents, causes = withhold_unsupported(_incident(), _causes(),
                                             config or AnalyticsConfig(), frame)
    assert set(causes[c.INCIDENT_ID]) == set(incidents[c.INCIDENT_ID])
    return incidents[c.INCIDENT_ID].to_list()


def test_a_tail_whose_instance_breached_against_its_peers_is_kept() -> None:
    assert _kept([_anomaly("tpot_p99_s"), _anomaly("tpot_p50_vs_peers")]) == ["i1"]


def test_without_the_peer_breach_the_same_tail_is_withheld() -> None:
    assert _kept([_anomaly("tpot_p99_s")]) == []
    assert _kept([]) == []
    # peers of another host, or at another time, do not support it
    assert _kept([_anomaly("tpot_p50_vs_peers", host="h03")]) == []
    assert _kept([_anomaly("tpot_p50_vs_peers", start_min=20)]) == []


def test_peer_support_can_be_switched_off() -> None:
    config = AnalyticsConfig(confirm_by_peers=False)
    assert _kept([_anomaly("tpot_p50_vs_peers")], config) == []


def test_a_prefix_drop_does_not_confirm_a_tpot_incident() -> None:
    config = AnalyticsConfig()
    drop = _causes(0.25, "prefix_cache_drop", e2e=3.0)  # mean e2e -25%
    incidents, _ = withhold_unsupported(_incident(), drop, config)
    assert incidents.is_empty()
    # the same score confirms a TTFT tail (prefill is its mechanism) ...
    incidents, _ = withhold_unsupported(_incident("ttft_p99_s"), drop, config)
    assert incidents[c.INCIDENT_ID].to_list() == ["i1"]
    # ... and any cause that acts on decode confirms the TPOT one
    incidents, _ = withhold_unsupported(_incident(), _causes(0.25, e2e=3.0), config)
    assert incidents[c.INCIDENT_ID].to_list() == ["i1"]
    # a TPOT incident whose users waited longer is kept whatever named it
    rose = _causes(0.25, "prefix_cache_drop", e2e=4.6)
    assert not withhold_unsupported(_incident(), rose, config)[0].is_empty()
