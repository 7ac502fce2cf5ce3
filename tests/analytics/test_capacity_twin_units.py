"""The twin's pieces on numbers worked by hand: the what-if syntax, the engine timed by
measured curves (:mod:`simulator.replay`), the calibration's corrections and the figures."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.capacity.twin import WhatIf, changed, parse_what_if
from fleetlens.analytics.capacity.twin_report import (
    ATTAINMENT,
    TPOT50,
    TPOT90,
    TTFT50,
    TTFT90,
    figures,
    off_present,
    report_table,
    twin_energy,
)
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from fleetlens.simulator.engine import DETOKENIZE_S, TOKENIZE_PER_TOKEN_S, TOKENIZE_S
from fleetlens.simulator.replay import Arrival, MeasuredSteps, replay
from tests.analytics.test_capacity_twin_calibration import calibration

STEPS = MeasuredSteps(base_s=0.01, per_seq_s=0.001, per_kv_s=0.0, prefill_base_s=0.004,
                      prefill_per_token_s=0.0001)


def test_what_if_syntax() -> None:
    assert parse_what_if(["gpus=-2"]) == WhatIf(gpus_delta=-2)
    assert parse_what_if(["gpus=6", "gpu_model=H200,max_num_seqs=128", "rate=x1.5"]) == \
        WhatIf(gpus=6, gpu_model="H200", max_num_seqs=128, rate=1.5)
    assert parse_what_if(["gpus=+1"]).label() == "gpus=+1"
    for bad in ("gpu=2", "gpus=two", "rate=0", "max_num_seqs"):
        with pytest.raises(ValueError, match="gpu|rate|max_num_seqs"):
            parse_what_if([bad])


def test_one_request_alone_takes_the_measured_step_times() -> None:
    done, busy = replay([Arrival(0, 1000, 11)], 1, STEPS, max_num_seqs=8,
                        max_batched_tokens=8192, kv_blocks=1000)
    (r,) = done
    prefill = 0.004 + 0.0001 * 1000  # one step computes the whole prompt
    assert r.ttft_s == pytest.approx(TOKENIZE_S + TOKENIZE_PER_TOKEN_S * 1000 + prefill)
    assert r.tpot_s == pytest.approx(0.01 + 0.001 * 1)  # decoding alone: batch 1
    assert r.e2e_s == pytest.approx(r.ttft_s + 10 * r.tpot_s + DETOKENIZE_S)
    assert busy == [pytest.approx(prefill + 10 * 0.011)]


def test_a_prompt_riding_in_decode_steps_costs_the_larger_of_the_two() -> None:
    # the second request arrives while the first decodes: their shared step takes
    # max(decode(1), prefill_base + per_token x (1 + 1000))
    arrivals = [Arrival(0, 1000, 200), Arrival(int(0.5e9), 1000, 2)]
    done, _ = replay(arrivals, 1, STEPS, max_num_seqs=8, max_batched_tokens=8192,
                     kv_blocks=1000)
    first, second = done
    assert second.ttft_s == pytest.approx(0.1041 + TOKENIZE_S + TOKENIZE_PER_TOKEN_S * 1000,
                                          abs=0.012)  # waits at most one decode step
    assert first.tpot_s > 0.011  # one of its steps carried the prompt
    assert max_num_seqs_queue() > 0.5


def max_num_seqs_queue() -> float:
    """With one seat, the second of two simultaneous requests waits for the first."""
    done, _ = replay([Arrival(0, 100, 100), Arrival(0, 100, 100)], 1, STEPS, max_num_seqs=1,
                     max_batched_tokens=8192, kv_blocks=1000)
    return max(r.ttft_s for r in done)


def test_fewer_gpus_and_another_gpu_model_change_the_calibration() -> None:
    config = AnalyticsConfig()
    cal = calibration()
    fewer = changed(cal, "meta-llama/Llama-3.1-8B-Instruct", WhatIf(gpus_delta=-1), config)
    assert fewer.engines == cal.engines - 1 and fewer.per_seq_s == cal.per_seq_s
    h200 = changed(cal, "meta-llama/Llama-3.1-8B-Instruct", WhatIf(gpu_model="H200"), config)
    assert h200.base_s == pytest.approx(cal.base_s * 3350 / 4800)
    assert h200.prefill_per_token_s == pytest.approx(cal.prefill_per_token_s)  # same FLOP/s
    assert h200.kv_blocks > cal.kv_blocks and h200.idle_w is None
    with pytest.raises(ValueError, match="whole engines"):
        changed(cal, "m", WhatIf(gpus=0), config)
    with pytest.raises(ValueError, match="no HBM"):
        changed(cal, "m", WhatIf(gpu_model="TPU-v9"), config)


def test_figures_count_unfinished_requests_as_missing_the_slo() -> None:
    lat = pl.DataFrame({c.TTFT_S: [0.1, 0.2, 3.0, 0.1], c.TPOT_S: [0.01, 0.05, 0.01, None],
                        c.OUTPUT_TOKENS: [10, 10, 10, 1]})
    got = figures(lat, unfinished=1, seconds=10.0, gpus=2, energy_j=62.0, tpot_slo_s=0.02,
                  ttft_slo_s=2.0)
    assert got["requests"] == 5
    assert got["slo_attainment"] == pytest.approx(2 / 5)  # the 1st and the one-token answer
    assert got["goodput_rps_per_gpu"] == pytest.approx(2 / 10 / 2)
    assert got["j_per_token"] == pytest.approx(62.0 / 31)
    assert twin_energy([4.0, 2.0], 10.0, 2, 100.0, 300.0) == pytest.approx(
        2 * (1000 + 800) + 2 * (1000 + 400))


def _row(name: str, ttft: float, tpot: float) -> dict:
    return {"row": name, c.REQUESTS: 100, TTFT50: ttft, TTFT90: 2 * ttft, TPOT50: tpot,
            TPOT90: 1.2 * tpot, ATTAINMENT: 1.0, c.GOODPUT_RPS_PER_GPU: 1.0,
            c.J_PER_TOKEN: None, "what_if": "rate=x2"}


def test_a_twin_that_misses_its_own_present_says_so() -> None:
    measured = _row("measured", 0.010, 0.0035)
    close = report_table("pool", [measured, _row("twin (present)", 0.011, 0.0033),
                                  _row("twin (what-if)", 0.02, 0.004)], [])
    assert "NOT VALIDATED" not in close
    assert "TTFT p90 +10%" in close
    far = report_table("pool", [measured, _row("twin (present)", 0.011, 0.0050),
                                _row("twin (what-if)", 0.02, 0.004)], [])
    assert "NOT VALIDATED: the twin's replay of the present misses TPOT p50, TPOT p90" in far
    # json/csv rows carry the same verdict (fleetlens capacity --what-if --format json)
    assert off_present(measured, _row("twin (present)", 0.011, 0.0033)) == []
    assert off_present(measured, _row("twin (present)", 0.011, 0.0050)) == ["TPOT p50",
                                                                             "TPOT p90"]
