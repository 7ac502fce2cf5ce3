"""``fleetlens capacity --what-if`` through the command line (issue 31 item 5), on simulated
fleets run end to end (simulator -> collector -> pipeline -> analytics): the twin calibrated
on a low-rate stretch replays the present within a few percent of what was measured,
predicts a higher rate within the issue's 20% of the simulator run at that rate, and each
change moves the figures the way its physics says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.capacity_twin import fleet
from bench.end_to_end import run_end_to_end
from fleetlens.cli import cli

MINUTES, RATE, FACTOR = 15, 3.0, 3.0
LATENCIES = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


def _fleet(tmp: Path, rate: float, seed: int) -> str:
    run_end_to_end(fleet(rate, MINUTES, seed, "H100-SXM", "llama-3.1-8b", 1), tmp)
    return str(tmp / "data")


@pytest.fixture(scope="module")
def low(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _fleet(tmp_path_factory.mktemp("twin-low"), RATE, 1)


@pytest.fixture(scope="module")
def high(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _fleet(tmp_path_factory.mktemp("twin-high"), RATE * FACTOR, 1001)


def what_if(root: str, *changes: str, fmt: str = "json") -> dict | str:
    args = ["capacity", "--data-dir", root, "--hours", "1", "--format", fmt]
    for change in changes:
        args += ["--what-if", change]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    return {r["row"]: r for r in json.loads(out.stdout)} if fmt == "json" else out.stdout


def test_the_twin_replays_the_present_as_measured(low: str) -> None:
    rows = what_if(low, "rate=1")
    measured, present = rows["measured"], rows["twin (present)"]
    assert present["requests"] == measured["requests"] > 1000
    for name in LATENCIES:
        assert present[name] == pytest.approx(measured[name], rel=0.10), name
    assert present["slo_attainment"] == pytest.approx(measured["slo_attainment"], abs=0.02)
    # the stepping power is priced on the present's energy: equal by construction
    assert present["j_per_token"] == pytest.approx(measured["j_per_token"], rel=1e-6)
    assert rows["twin (what-if)"]["tpot_p50_s"] == pytest.approx(present["tpot_p50_s"])
    # the replay of the present within 20%: the machine-readable rows say it is validated
    assert all(r["twin_validated"] is True for r in rows.values())


def test_a_higher_rate_is_predicted_within_20_percent_of_the_simulator(low: str,
                                                                       high: str) -> None:
    predicted = what_if(low, f"rate={FACTOR:g}")["twin (what-if)"]
    actual = what_if(high, "rate=1")["measured"]
    for name in (*LATENCIES, "goodput_rps_per_gpu", "j_per_token"):
        assert predicted[name] == pytest.approx(actual[name], rel=0.20), name
    # and it is a prediction: the low rate's own figures are further off on TPOT and J/token
    present = what_if(low, "rate=1")["measured"]
    assert abs(present["j_per_token"] / actual["j_per_token"] - 1) > 0.5


def test_fewer_gpus_fewer_seats_and_a_faster_gpu(low: str) -> None:
    rows = what_if(low, "gpus=-1")
    present, fewer = rows["twin (present)"], rows["twin (what-if)"]
    assert fewer["what_if"] == "gpus=-1"
    # every request on one GPU: about twice the good requests per GPU, longer steps
    assert fewer["goodput_rps_per_gpu"] == pytest.approx(2 * present["goodput_rps_per_gpu"],
                                                         rel=0.05)
    assert fewer["tpot_p50_s"] > present["tpot_p50_s"]
    seats = what_if(low, "max_num_seqs=1")["twin (what-if)"]
    assert seats["ttft_p90_s"] > 10 * present["ttft_p90_s"]  # one at a time: a queue
    faster = what_if(low, "gpu_model=H200")["twin (what-if)"]
    assert faster["tpot_p50_s"] < 0.85 * present["tpot_p50_s"]
    assert faster["j_per_token"] is None  # the H200's power was never measured here


def test_the_table_names_the_twins_own_error_and_bad_changes_fail_in_one_line(low: str
                                                                              ) -> None:
    table = what_if(low, "gpus=-1,max_num_seqs=64", fmt="table")
    for text in ("measured", "twin (present)", "twin (what-if)", "gpus=-1, max_num_seqs=64",
                 "the twin's own error on the present: TTFT p50"):
        assert text in table
    out = CliRunner().invoke(cli, ["capacity", "--data-dir", low, "--what-if", "gpus=-2"])
    assert out.exit_code == 2 and "whole engines" in out.output
    out = CliRunner().invoke(cli, ["capacity", "--data-dir", low, "--what-if", "cpus=2"])
    assert out.exit_code == 2 and "KEY=VALUE" in out.output
