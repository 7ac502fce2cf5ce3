"""Scenario parsing: presets, host expansion, dimensions, and errors that name the place."""

from __future__ import annotations

import copy
import time

import pytest

from fleetlens.pipeline.schema import columns as c
from fleetlens.simulator import ScenarioError, load_scenario, parse_scenario
from fleetlens.simulator.scenario import parse_start
from tests.simulator.test_simulate import QUICK, small


def test_quick_scenario_loads() -> None:
    sc = load_scenario(QUICK)
    assert [h.name for h in sc.hosts] == ["h01", "h02", "h03", "h04"]
    assert sc.hosts[2].dims["region"] == "us-west-2"
    assert sc.hosts[0].dims[c.GPU_MODEL] == "NVIDIA H100 80GB HBM3"
    assert sc.deployments[1].tp == 4 and sc.deployments[1].model.layers == 80
    assert [i.kind for i in sc.incidents] == ["thermal_throttle", "traffic_surge",
                                              "kv_cache_pressure"]
    assert sc.incidents[0].host == "h02" and sc.incidents[0].gpu == 1


def test_presets_take_overrides() -> None:
    doc = small()
    doc["fleet"]["hosts"][0]["gpu"] = {"preset": "H100-SXM", "tdp_w": 500.0}
    doc["deployment"][0]["model"] = {"preset": "llama-3.1-8b", "layers": 16}
    sc = parse_scenario(doc)
    assert sc.hosts[0].gpu.tdp_w == 500.0 and sc.hosts[0].gpu.hbm_gbps == 3350.0
    assert sc.deployments[0].model.layers == 16


def test_hash_follows_content() -> None:
    doc = small()
    same, other = copy.deepcopy(doc), copy.deepcopy(doc)
    other["workload"][0]["rate"] = 7.0
    assert parse_scenario(doc).sha256 == parse_scenario(same).sha256
    assert parse_scenario(doc).sha256 != parse_scenario(other).sha256


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["fleet"].update(durations=1), "unknown key"),
    (lambda d: d["deployment"][0].update(max_num_seq=4), "max_num_seq"),
    (lambda d: d["deployment"][0].update(hosts=["x*"]), "match no host"),
    (lambda d: d["deployment"][0].update(model="gpt-9"), "unknown preset"),
    (lambda d: d["deployment"][0].update(model="llama-3.1-70b"), "does not fit"),
    (lambda d: d["deployment"][0].update(tp=4), "free GPUs"),
    (lambda d: d["workload"][0].update(service="nope"), "no deployment named"),
    (lambda d: d["workload"][0].update(rate=-1), "rate"),
    (lambda d: d["workload"][0].update(replay="x.csv"), "format"),
    (lambda d: d["workload"][0].update(prompt={"dist": "pareto"}), "bad distribution"),
    (lambda d: d["incident"][0].update(kind="gremlins"), "is not one of"),
    (lambda d: d["incident"][0].update(host="h09"), "no host named"),
    (lambda d: d["incident"].append({"kind": "slow_gpu", "gpu": "h01:7", "start_s": 1,
                                     "duration_s": 1}), "has no GPU 7"),
    (lambda d: d["incident"].append({"kind": "traffic_surge", "host": "h01", "start_s": 1,
                                     "duration_s": 1}), "needs a 'service'"),
    (lambda d: d["incident"].append({"kind": "power_cap", "service": "chat", "start_s": 1,
                                     "duration_s": 1}), "needs a 'host'"),
    (lambda d: d["incident"].append({"kind": "collective_stall", "host": "h01", "start_s": 1,
                                     "duration_s": 1}), "tensor-parallel"),
    (lambda d: d["workload"][0].update(gateway_share=0.0) or d["incident"].append(
        {"kind": "network_overhead", "host": "h01", "start_s": 1, "duration_s": 1}),
     "no gateway traffic"),
    (lambda d: d["fleet"].update(start="yesterday"), "not a time"),
    (lambda d: d["fleet"].update(duration_s=0), "positive"),
])
def test_errors_name_the_place(mutate, message: str) -> None:
    doc = small()
    mutate(doc)
    with pytest.raises(ScenarioError, match=message):
        from fleetlens.simulator.fleet import Fleet

        Fleet(parse_scenario(doc), 1)


def test_a_missing_file_and_bad_toml_are_clear(tmp_path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[fleet\n")
    with pytest.raises(ScenarioError, match="invalid TOML"):
        load_scenario(bad)


def test_relative_starts() -> None:
    now = time.time()
    assert abs(parse_start("now") / 1e9 - now) < 120
    assert abs(parse_start("now-2h") / 1e9 - (now - 7200)) < 120
    assert parse_start("2026-01-05T14:00:00Z") == 1_767_621_600 * 10**9
    with pytest.raises(ScenarioError, match="in the future"):
        parse_start("now+2h")
