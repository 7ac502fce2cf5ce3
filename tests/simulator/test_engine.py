"""The engine model through its real interface: invariants of spans and counters, chunked
prefill, preemption by recompute, and the seat limit."""

from __future__ import annotations

import statistics

from fleetlens.pipeline.schema import attributes as a
from tests.simulator.helpers import simulate, tpot


def one_engine(rate: float = 4.0, **deployment) -> dict:
    return {
        "fleet": {"name": "engine", "duration_s": 60, "drain_s": 600, "seed": 2,
                  "hosts": [{"name": "h01", "gpus": 1}]},
        "deployment": [{"service": "s", "model": "llama-3.1-8b", **deployment}],
        "workload": [{"service": "s", "rate": rate, "prefix_groups": 2, "prefix_tokens": 300,
                      "prefix_share": 0.5,
                      "prompt": {"median": 1500, "sigma": 1.0, "max": 16000},
                      "output": {"median": 300, "sigma": 0.8, "max": 3000}}],
    }


def last(out, metric: str) -> float:
    return out.series(metric)[-1][1]


def test_span_phases_and_counters_add_up() -> None:
    out = simulate(one_engine())
    spans = out.requests()
    assert len(spans) == out.result.requests > 150
    for s in spans:
        x = s.attributes
        assert x[a.GEN_AI_TIME_IN_QUEUE] >= 0 and x[a.GEN_AI_PREFILL] > 0
        assert abs(x[a.GEN_AI_INFERENCE] - x[a.GEN_AI_PREFILL] - x[a.GEN_AI_DECODE]) < 1e-9
        assert x[a.GEN_AI_TTFT] >= x[a.GEN_AI_TIME_IN_QUEUE] + x[a.GEN_AI_PREFILL] - 1e-9
        assert x[a.GEN_AI_E2E] >= x[a.GEN_AI_TTFT] + x[a.GEN_AI_DECODE] - 1e-9
    assert last(out, a.ENGINE_GENERATION_TOKENS) == sum(
        s.attributes[a.GEN_AI_COMPLETION_TOKENS] for s in spans)
    assert last(out, a.ENGINE_PROMPT_TOKENS) == sum(
        s.attributes[a.GEN_AI_PROMPT_TOKENS] for s in spans)
    hits, queries = last(out, a.ENGINE_PREFIX_CACHE_HITS), last(out,
                                                                a.ENGINE_PREFIX_CACHE_QUERIES)
    assert 0 < hits < queries
    assert last(out, a.ENGINE_KV_CACHE_USAGE) == 0.0  # drained: only evictable blocks left


def test_chunked_prefill_keeps_decode_steps_short() -> None:
    # a small token budget splits long prompts over many steps, so the decoding requests
    # beside them are not stalled by one long prefill step
    def tpots(budget: int) -> tuple[float, int]:
        out = simulate(one_engine(rate=8.0, max_num_batched_tokens=budget))
        longest = max(s.attributes[a.GEN_AI_PROMPT_TOKENS] for s in out.requests())
        return statistics.median(map(tpot, out.requests())), longest

    small, longest = tpots(512)
    large, _ = tpots(8192)
    assert longest > 8192  # prompts longer than the budget are served
    assert small < 0.6 * large


def test_kv_exhaustion_preempts_and_recomputes_without_losing_tokens() -> None:
    roomy = simulate(one_engine())
    tight = simulate(one_engine(kv_blocks=1200))  # 19,200 tokens
    assert last(roomy, a.ENGINE_PREEMPTIONS) == 0
    assert last(tight, a.ENGINE_PREEMPTIONS) > 10
    usage = [v for _, v in tight.series(a.ENGINE_KV_CACHE_USAGE)]
    assert max(usage) > 0.95

    def outputs(out):
        return sorted((s.context.trace_id, s.attributes[a.GEN_AI_COMPLETION_TOKENS])
                      for s in out.requests())

    assert outputs(tight) == outputs(roomy)  # every request still gets all its tokens
    decode = a.GEN_AI_DECODE
    assert max(s.attributes[decode] for s in tight.requests()) > max(
        s.attributes[decode] for s in roomy.requests())


def test_running_never_exceeds_max_num_seqs() -> None:
    out = simulate(one_engine(max_num_seqs=4))
    running = [v for _, v in out.series(a.ENGINE_NUM_RUNNING)]
    waiting = [v for _, v in out.series(a.ENGINE_NUM_WAITING)]
    assert max(running) == 4 and max(waiting) > 10
