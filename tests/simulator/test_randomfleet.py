"""Random fleets (simulator.randomfleet) and paired-control validation (simulator.control)."""

from __future__ import annotations

import pytest

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.simulator import parse_scenario, run
from fleetlens.simulator.control import LatencyProbe, validate, without_incidents
from fleetlens.simulator.fleet import Fleet
from fleetlens.simulator.randomfleet import (
    AZURE_TRACE,
    DRAWN,
    FULL,
    SMALL,
    WARMUP_S,
    random_fleet,
)
from fleetlens.simulator.specs import GPU_PRESETS, MODEL_PRESETS
from tests.simulator.helpers import simulate

SEEDS = range(40)


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return [random_fleet(seed, size) for seed in SEEDS for size in (SMALL, FULL)]


def test_same_seed_same_fleet_other_seed_other_fleet() -> None:
    assert random_fleet(3) == random_fleet(3)
    assert random_fleet(3) != random_fleet(4)


def test_every_fleet_is_a_valid_scenario(docs) -> None:
    for doc in docs:
        Fleet(parse_scenario(doc), doc["fleet"]["seed"])  # raises ScenarioError if invalid


def test_the_draws_cover_the_space(docs) -> None:
    """Every GPU and model preset, 2/4/8 GPUs per host, TP 1/2/4/8, shared hosts, every
    cause, daily cycles, bursts and (when the trace is here) the Azure replay."""
    hosts = [h for d in docs for h in d["fleet"]["hosts"]]
    deps = [x for d in docs for x in d["deployment"]]
    workloads = [w for d in docs for w in d["workload"]]
    incidents = [x for d in docs for x in d["incident"]]
    assert {h["gpu"] for h in hosts} == set(GPU_PRESETS)
    assert {h["gpus"] for h in hosts} == {2, 4, 8}
    assert {x["model"] for x in deps} == set(MODEL_PRESETS)
    assert {x["tp"] for x in deps} == {1, 2, 4, 8}
    assert any(len({tuple(x["hosts"]) for x in d["deployment"]}) < len(d["deployment"])
               for d in docs), "no fleet has two services on the same hosts"
    assert {x["kind"] for x in incidents} == set(DRAWN)  # every cause but the restart
    assert any(w.get("daily_amplitude", 0) > 0 for w in workloads)
    assert any(w.get("bursts_per_hour", 0) > 0 for w in workloads)
    assert any(w.get("replay") for w in workloads) == AZURE_TRACE.is_file()
    assert all(180 <= x["duration_s"] <= 900 and x["start_s"] >= WARMUP_S for x in incidents)
    assert len({round(x["magnitude"], 3) for x in incidents if x["kind"] == "power_cap"}) > 5


def _truth(doc: dict) -> list[dict]:
    fleet = Fleet(parse_scenario(doc), 0)
    return fleet.injector.ground_truth(0)["incidents"]


def test_overlapping_incidents_share_no_engine(docs) -> None:
    overlaps = 0
    for doc in docs:
        truth = _truth(doc)
        for i, x in enumerate(truth):
            for y in truth[i + 1:]:
                if x[c.START_NS] < y[c.END_NS] and y[c.START_NS] < x[c.END_NS]:
                    overlaps += 1
                    assert not set(x["instances"]) & set(y["instances"]), (x, y)
    assert overlaps > 5  # and overlaps do happen


CONTROL_DOC = {
    "fleet": {"name": "control", "start": "2026-01-05T14:00:00Z", "duration_s": 900,
              "drain_s": 60, "seed": 5, "hosts": [{"prefix": "h", "count": 2, "gpus": 2}]},
    "deployment": [{"service": "chat", "model": "llama-3.1-8b", "max_num_seqs": 32}],
    "workload": [{"service": "chat", "rate": 6.0, "gateway_share": 0.5,
                  "prompt": {"median": 600, "sigma": 0.5, "max": 4000},
                  "output": {"median": 150, "sigma": 0.5, "max": 600}}],
    "incident": [
        # 50 ms more CPU per engine step: every token slower
        {"kind": "engine_overhead", "host": "h01", "start_s": 120, "duration_s": 240,
         "magnitude": 0.05},
        # a 95% power cap on a GPU that draws far less: no effect at all
        {"kind": "power_cap", "gpu": "h02:0", "start_s": 500, "duration_s": 240,
         "magnitude": 0.95},
    ],
}


def test_validation_keeps_a_real_effect_and_drops_a_null_one() -> None:
    sc = parse_scenario(CONTROL_DOC)
    treated, control = LatencyProbe(sc.start_ns), LatencyProbe(sc.start_ns)
    result = run(sc, export=False, probe=treated)
    run(parse_scenario(without_incidents(CONTROL_DOC)), export=False, probe=control)
    strong, null = validate(result.ground_truth, treated, control)
    assert strong.valid and strong.ratio > 2, strong
    assert not null.valid and 0.9 < null.ratio < 1.25, null


def test_probe_sees_what_the_spans_say() -> None:
    """The probe's latencies are the exported spans' (an unexported control run is the same
    simulation as an exported one)."""
    doc = {**CONTROL_DOC, "incident": []}
    probe = LatencyProbe(parse_scenario(doc).start_ns)
    run(parse_scenario(doc), export=False, probe=probe)
    spans = simulate(doc).requests()
    ttfts = sorted(round(s.attributes[a.GEN_AI_TTFT], 9) for s in spans)
    probed = sorted(round(row[1], 9) for rows in probe.rows.values() for row in rows)
    assert len(spans) > 1000 and probed == ttfts
