"""Sizing the real-vLLM incident load from what the server serves
(``tests/agent/test_vllm_incidents.py``).

The CPU build of vLLM decoded anything from ~750 to ~5,700 tokens/s of the tiny model on the
machines these tests ran on. Fixed rates were then either no surge at all or an overload
from the start (a clean-clone CI run served 2 req/s of 380-token answers under a steady 3
req/s). The analytics needs its own conditions whatever the machine: 10 s windows with
enough requests to be judged (``min_requests_median`` is 10), a steady load well under the
server's capacity and a surge well above it. So the load is sized in two steps:

1. the answer length: a calibration burst at the longest answer measures the decode
   throughput, and the answer is shortened, a cache block at a time, until the server
   completes about :data:`TARGET_CAPACITY` requests a second (two blocks at least);
2. the rates: a second burst at that length measures the capacity ``c``; the steady load
   is 40% of it (a short queue), the surge twice it for a minute.

The small KV cache of the second case follows the answer length: every request fills
``blocks`` cache blocks by its end, the restarted server's ``--max-model-len`` is that many
blocks, and its cache one block more (1.25-1.5 requests), so growing requests are
preempted and the rest wait.
"""

from __future__ import annotations

from dataclasses import dataclass

#: vLLM's CPU cache block, tokens
BLOCK_TOKENS = 128
#: the tiny model's KV cache per token: 2 layers x (K, V) x 1 KV head x 32 dims x 2 bytes
KV_BYTES_PER_TOKEN = 2 * 2 * 1 * 32 * 2
#: a prompt of 100 words is ~106 tokens of the tiny model's tokenizer; this bounds it
PROMPT_WORDS, PROMPT_TOKENS_MAX = 100, 120
#: cache blocks a request holds at its end: 4 (a 392-token answer: the calibration's, and
#: about runs 1-8's 380) down to 2 (136 tokens: still one block of growth after admission)
MAX_BLOCKS, MIN_BLOCKS = 4, 2
#: requests per second the answer length is chosen for: a steady 40% of it is ~24 requests
#: per 10 s window
TARGET_CAPACITY = 6.0
#: The load as fractions of the capacity, capped at the fixed rates of runs 1-5 (3 and 16
#: req/s on servers of 9-15 req/s), which passed: 40% leaves the steady queue short; twice
#: the capacity for a minute queues ~60 s of work, drained at 60% of it.
STEADY_OF_CAPACITY, STEADY_MAX = 0.4, 3.0
SURGE_OF_CAPACITY, SURGE_MAX = 2.0, 16.0
#: fewest steady requests per second for 10 s windows the median detector judges (10
#: requests at least): 15 a window on average
MIN_STEADY = 1.5


@dataclass(frozen=True)
class Shape:
    """The requests of one run, by the cache blocks each holds at its end (the answer fills
    them), and the small cache of the second case."""

    blocks: int = MAX_BLOCKS

    @classmethod
    def for_throughput(cls, tokens_per_s: float) -> Shape:
        """The shape at which ``tokens_per_s`` serves about TARGET_CAPACITY req/s."""
        wanted = (PROMPT_TOKENS_MAX + tokens_per_s / TARGET_CAPACITY) / BLOCK_TOKENS
        return cls(max(MIN_BLOCKS, min(MAX_BLOCKS, round(wanted))))

    @property
    def max_tokens(self) -> int:
        return self.max_model_len - PROMPT_TOKENS_MAX

    @property
    def max_model_len(self) -> int:
        return self.blocks * BLOCK_TOKENS

    @property
    def small_kv_bytes(self) -> int:
        """One block more than a whole request (vLLM needs ``max_model_len`` to fit): room
        for 1.25-1.5 requests, so growing ones are preempted and the rest wait."""
        return (self.blocks + 1) * BLOCK_TOKENS * KV_BYTES_PER_TOKEN


@dataclass(frozen=True)
class Load:
    """The rates of one run, sized from the server's measured capacity."""

    capacity: float  # req/s of these requests the server completed when saturated
    steady: float
    surge: float

    @classmethod
    def of(cls, capacity: float) -> Load:
        return cls(round(capacity, 2), min(STEADY_MAX, STEADY_OF_CAPACITY * capacity),
                   min(SURGE_MAX, SURGE_OF_CAPACITY * capacity))

    @property
    def judged(self) -> bool:
        """Whether the steady load gives 10 s windows enough requests to be judged."""
        return self.steady >= MIN_STEADY
