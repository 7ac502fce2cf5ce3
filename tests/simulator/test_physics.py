"""Physics of the engine model: batching, bandwidth, energy, and published H100 figures."""

from __future__ import annotations

import statistics

import pytest

from fleetlens.pipeline.schema import attributes as a
from tests.simulator.helpers import simulate, tpot


def one_gpu(batch: int, gpu: str = "H100-SXM", prompt: int = 512, output: int = 256) -> dict:
    """One GPU serving Llama-3.1-8B, loaded well past ``batch`` seats (the batch stays full)."""
    return {
        "fleet": {"name": "physics", "duration_s": 90, "drain_s": 0, "seed": 1,
                  "hosts": [{"name": "h01", "gpus": 1, "gpu": gpu}]},
        "deployment": [{"service": "s", "model": "llama-3.1-8b", "max_num_seqs": batch}],
        "workload": [{"service": "s", "rate": batch * 0.6,
                      "prompt": {"dist": "fixed", "value": prompt, "max": 100_000},
                      "output": {"dist": "fixed", "value": output, "max": 100_000}}],
    }


def measure(batch: int, gpu: str = "H100-SXM") -> dict[str, float]:
    """Steady-state output tok/s, median TPOT, J per output token and mean batch."""
    out = simulate(one_gpu(batch, gpu))
    energy, tokens = out.series(a.HW_ENERGY), out.series(a.ENGINE_GENERATION_TOKENS)
    running = [v for _, v in out.series(a.ENGINE_NUM_RUNNING)[3:]]
    first, last = 3, len(energy) - 1  # skip the first 30 s while the batch fills
    seconds = (energy[last][0] - energy[first][0]) / 1e9
    generated = tokens[last][1] - tokens[first][1]
    return {"tok_s": generated / seconds,
            "tpot_s": statistics.median(tpot(s) for s in out.requests()),
            "j_per_token": (energy[last][1] - energy[first][1]) / generated,
            "batch": statistics.mean(running)}


@pytest.fixture(scope="module")
def sweep() -> dict[int, dict[str, float]]:
    return {b: measure(b) for b in (1, 8, 32, 64, 128, 256)}


def test_the_batch_stays_full(sweep) -> None:
    for batch, m in sweep.items():
        assert m["batch"] >= 0.95 * batch


def test_throughput_rises_with_batch_and_saturates(sweep) -> None:
    rates = [sweep[b]["tok_s"] for b in sorted(sweep)]
    assert rates == sorted(rates)
    assert sweep[8]["tok_s"] > 6 * sweep[1]["tok_s"]  # nearly linear while memory-bound
    assert sweep[256]["tok_s"] < 1.5 * sweep[128]["tok_s"]  # doubling the batch: < 1.5x


def test_tpot_rises_with_batch(sweep) -> None:
    tpots = [sweep[b]["tpot_s"] for b in sorted(sweep)]
    assert tpots == sorted(tpots)
    assert sweep[256]["tpot_s"] > 2 * sweep[1]["tpot_s"]


def test_tpot_falls_with_hbm_bandwidth(sweep) -> None:
    h200 = measure(64, "H200")  # 4.8 TB/s vs the H100's 3.35 TB/s, same FLOP/s
    a100 = measure(64, "A100-80GB")  # 2.0 TB/s
    assert a100["tpot_s"] > sweep[64]["tpot_s"] > h200["tpot_s"]


def test_joules_per_token_fall_with_batch(sweep) -> None:
    energies = [sweep[b]["j_per_token"] for b in sorted(sweep)]
    assert energies == sorted(energies, reverse=True)


@pytest.mark.parametrize("batch", [64, 128, 256])
def test_llama_8b_on_h100_near_published_figures(sweep, batch: int) -> None:
    # published: roughly 0.08-0.12 J/token and inter-token latency in the tens of ms
    m = sweep[batch]
    assert 0.06 <= m["j_per_token"] <= 0.13
    assert 0.010 <= m["tpot_s"] <= 0.050
