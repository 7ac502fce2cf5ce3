"""Unit checks of the model's parts: KV blocks, roofline sums, power control, span shape."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator.kvcache import BlockPool
from fleetlens.simulator.power import REASON_SW_POWER_CAP, GpuState
from fleetlens.simulator.roofline import StepModel, _sum_max
from fleetlens.simulator.specs import GPU_PRESETS, MODEL_PRESETS
from fleetlens.simulator.telemetry import ProcessExporter, llm_request_record
from fleetlens.simulator.workload import Request


def test_prefix_blocks_are_shared_and_evicted_least_recent_first() -> None:
    pool = BlockPool(10)
    a_keys, b_keys = [("a", i) for i in range(4)], [("b", i) for i in range(4)]
    assert pool.acquire(a_keys, 1) and pool.free == 5
    assert pool.lookup(a_keys) == 4 and pool.lookup(b_keys) == 0
    assert pool.acquire(a_keys[:2], 0) and pool.free == 5  # shared, no new blocks
    pool.release(a_keys[:2], 0)
    pool.release(a_keys, 1)
    assert pool.free == 10 and pool.lookup(a_keys) == 4  # cached, evictable
    assert pool.acquire(b_keys, 4)  # needs 2 evictions: the least recently used
    assert pool.lookup(a_keys) == 0 and pool.lookup(a_keys[2:]) == 2


def test_hits_are_pinned_before_eviction() -> None:
    pool = BlockPool(4)
    keys = [("p", i) for i in range(4)]
    pool.acquire(keys, 0)
    pool.release(keys, 0)
    # reuse the first two cached blocks and need two more: only the other two may go
    assert pool.acquire(keys[:2], 2)
    assert pool.lookup(keys) == 2 and pool.free == 0
    assert not pool.acquire([], 1)


def test_reserved_blocks_count_as_used() -> None:
    pool = BlockPool(100)
    pool.reserved = 90
    assert pool.usage == 0.9 and not pool.acquire([], 11) and pool.acquire([], 10)


@given(st.floats(0, 10), st.floats(-1, 1), st.floats(0, 10), st.floats(-1, 1),
       st.integers(0, 300))
def test_sum_of_max_matches_brute_force(a1, b1, a2, b2, n) -> None:
    brute = sum(max(a1 + b1 * i, a2 + b2 * i) for i in range(n))
    assert abs(_sum_max(a1, b1, a2, b2, n) - brute) <= 1e-6 * max(1.0, abs(brute))


def test_a_decode_run_equals_its_steps() -> None:
    model = StepModel(MODEL_PRESETS["llama-3.1-70b"], GPU_PRESETS["H100-SXM"], 4, 0.6, 0.8,
                      0.002)
    batch, context, k = 48, 48 * 900, 37
    kernel = compute = memory = comm = 0.0
    for i in range(k):
        ctx = context + batch * i
        step = model.step(batch, ctx, float(ctx))
        kernel, compute, memory, comm = (kernel + step[0], compute + step[1],
                                         memory + step[2], comm + step[3])
    run = model.decode_run(batch, context, k)
    for got, want in zip(run, (kernel, compute, memory, comm), strict=True):
        assert abs(got - want) < 1e-9


def test_power_cap_controller_holds_the_limit_and_sets_the_reason() -> None:
    gpu = GpuState(GPU_PRESETS["H100-SXM"], "h01", 0, "GPU-x")
    gpu.power_limit_w = 300.0
    powers = []
    for _ in range(30):  # a busy GPU: memory-bound kernels all the time
        gpu.spend(1.0, 0.9, 1.0, 0.0, 0.0)
        gpu.control(1.0)
        powers.append(gpu.last_power_w)
    assert powers[0] > 500 and max(powers[-10:]) <= 300 * 1.02
    assert gpu.clock < 0.8 and gpu.reasons & REASON_SW_POWER_CAP
    assert gpu.energy_j == sum(powers)


def test_llm_request_record_leaves_out_zero_sampling_parameters() -> None:
    r = Request()
    r.engine_ns, r.queued_t, r.scheduled_t = 1_000_000_000, 1.001, 1.002
    r.first_token_t, r.last_token_t, r.finish_t = 1.05, 1.5, 1.501
    r.prompt_len, r.generated, r.rid = 100, 10, "cmpl-1-0"
    r.max_tokens, r.temperature, r.top_p = 64, 0.0, 0.0
    r.trace, r.span = 5, 6
    _, _, _, parent, name, start, end, attrs = llm_request_record(r, "x", 0)
    assert name == a.VLLM_REQUEST_SPAN and parent == 0
    assert a.GEN_AI_TEMPERATURE not in attrs and a.GEN_AI_TOP_P not in attrs
    assert attrs[a.GEN_AI_MAX_TOKENS] == 64 and attrs[a.GEN_AI_N] == 1
    assert abs(attrs[a.GEN_AI_E2E] - 0.501) < 1e-9 and end - start == 501_000_000
    assert abs(attrs[a.GEN_AI_INFERENCE] - attrs[a.GEN_AI_PREFILL]
               - attrs[a.GEN_AI_DECODE]) < 1e-12


def test_a_dead_export_process_fails_the_run_instead_of_hanging() -> None:
    exporter = ProcessExporter("127.0.0.1:9", {}, 0)
    exporter._process.kill()
    exporter._process.wait()
    record = ("x", 1, 2, 0, a.VLLM_REQUEST_SPAN, 1, 2, {a.GEN_AI_REQUEST_ID: "r" * 1000})
    with pytest.raises(RuntimeError, match="export process died"):
        for _ in range(200):  # more than the pipe holds
            exporter.spans([record] * 1024)
    exporter.abort()


def test_a_limit_below_idle_power_keeps_the_clock_at_its_floor() -> None:
    # Random fleet 11008 (seed 11): a thermal throttle on a hot inlet left less allowed
    # power than an L4 draws idle; the controller raised a negative ratio to 1/2.5 and the
    # simulation died with "'<' not supported between 'float' and 'complex'".
    gpu = GpuState(GPU_PRESETS["L4"], "h01", 0, "GPU-x")
    gpu.power_limit_w = gpu.spec.idle_w * 0.5
    floor = gpu.spec.min_clock_mhz / gpu.spec.max_clock_mhz
    for _ in range(10):  # barely busy, then busy: both branches of the controller
        gpu.spend(0.01, 0.1, 1.0, 0.0, 0.99)
        gpu.control(1.0)
        assert isinstance(gpu.clock, float) and floor <= gpu.clock <= 1.0
        gpu.spend(1.0, 0.9, 1.0, 0.0, 0.0)
        gpu.control(1.0)
        assert isinstance(gpu.clock, float) and floor <= gpu.clock <= 1.0
    assert gpu.clock < 0.5  # busy under a cap below idle: as slow as it goes
