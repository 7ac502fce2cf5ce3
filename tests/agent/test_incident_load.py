"""The real-vLLM incident load sizing (``tests/agent/incident_load.py``), without a server."""

from __future__ import annotations

import pytest

from tests.agent.incident_load import (
    BLOCK_TOKENS,
    KV_BYTES_PER_TOKEN,
    PROMPT_TOKENS_MAX,
    Load,
    Shape,
)


@pytest.mark.parametrize(("tokens_per_s", "blocks"), [
    (200.0, 2),  # slower than any machine seen: the shortest answer
    (874.0, 2),  # a clean-clone CI machine (2.3 req/s of 380-token answers)
    (1_500.0, 3),
    (5_700.0, 4),  # runs 1-5: the old fixed shape
])
def test_the_answer_shortens_with_the_throughput(tokens_per_s: float, blocks: int) -> None:
    shape = Shape.for_throughput(tokens_per_s)
    assert shape.blocks == blocks
    # the longest prompt and the answer fill the request's blocks, which the model allows
    assert PROMPT_TOKENS_MAX + shape.max_tokens == shape.max_model_len <= 512
    # the small cache holds the longest request, and not two of the usual (~106-token
    # prompts): two growing requests cannot both finish without a preemption
    cached_tokens = shape.small_kv_bytes / KV_BYTES_PER_TOKEN
    usual = 106 + shape.max_tokens
    assert shape.max_model_len < cached_tokens < 2 * usual
    assert cached_tokens % BLOCK_TOKENS == 0


def test_the_old_shape_is_the_longest() -> None:
    assert Shape().max_tokens == 392 and Shape().small_kv_bytes == 5 * 128 * 256


@pytest.mark.parametrize(("capacity", "steady", "surge", "judged"), [
    (2.3, 0.92, 4.6, False),  # 380-token answers on the CI machine: too few per window
    (6.4, 2.56, 12.8, True),
    (14.5, 3.0, 16.0, True),  # runs 1-5's rates
])
def test_the_rates_follow_the_capacity(capacity: float, steady: float, surge: float,
                                       judged: bool) -> None:
    load = Load.of(capacity)
    assert (load.steady, load.surge) == pytest.approx((steady, surge))
    assert load.judged is judged
    assert load.surge > capacity > load.steady  # above it, then under it
