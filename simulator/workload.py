"""Requests and the arrival processes that create them.

A :class:`Stream` turns one ``[[workload]]`` into requests tick by tick: a Poisson process
whose rate follows a daily cosine and random bursts, or a replayed trace (Azure CSV
``TIMESTAMP,ContextTokens,GeneratedTokens``; Mooncake JSONL ``timestamp, input_length,
output_length, hash_ids``). Every request draws the same number of random numbers whatever
the incidents do, and each workload has its own generators, so an incident on one service
never changes another service's requests.
"""

from __future__ import annotations

import csv
import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist

from fleetlens.simulator.scenario import LengthDist, ScenarioError
from fleetlens.simulator.specs import BLOCK_TOKENS

#: Mooncake traces hash prompts in blocks of this many tokens.
MOONCAKE_BLOCK_TOKENS = 512


class Request:
    """One inference request, from arrival to its last token (times in virtual seconds)."""

    __slots__ = (
        "seq", "service", "client_ns", "engine_ns", "net_s", "prompt_len", "out_target",
        "max_tokens", "temperature", "top_p", "prefix_key", "prefix_blocks", "hash_ids",
        "trace", "span", "gateway_span_id", "rid", "instance",
        "queued_t", "computed", "generated", "hashed", "plain", "capacity", "scheduled_t",
        "first_token_t", "last_token_t", "finish_t", "preemptions", "post_s", "gateway",
        "status",
    )

    def __init__(self) -> None:
        # capacity: KV tokens the held blocks (hashed + plain) can store
        self.computed = self.generated = self.plain = self.capacity = self.preemptions = 0
        self.hashed: list = []
        self.scheduled_t = self.first_token_t = self.last_token_t = self.finish_t = -1.0
        self.hash_ids: list[int] | None = None
        self.gateway_span_id = 0
        self.net_s = 0.0
        self.instance = None
        self.status = 0  # HTTP status of a failed request (simulator.failures), else 0

    def block_keys(self) -> list:
        """Hash keys of the prompt's full blocks that a prefix cache may share."""
        if self.hash_ids is not None:
            per = MOONCAKE_BLOCK_TOKENS // BLOCK_TOKENS
            count = min(len(self.hash_ids) * per, self.prompt_len // BLOCK_TOKENS)
            return [(self.hash_ids[i // per], i % per) for i in range(count)]
        key = self.prefix_key
        return [(key, i) for i in range(self.prefix_blocks)] if key is not None else []


def sample_length(dist: LengthDist, rng: random.Random) -> int:
    """One draw of a token length (always exactly one random number)."""
    u = rng.random()
    if dist.dist == "fixed":
        value = dist.value or dist.median
    elif dist.dist == "uniform":
        value = dist.min + u * (dist.max - dist.min + 1)
    else:  # lognormal by inverse CDF, so one uniform draw per sample
        value = dist.median * math.exp(dist.sigma * _NORMAL.inv_cdf(min(max(u, 1e-12), 1 - 1e-12)))
    return int(min(max(int(value), dist.min), dist.max))


#: The standard normal: its inverse CDF turns one uniform draw into a lognormal length
#: (the standard library's, exact to double precision, instead of a hand approximation).
_NORMAL = NormalDist()


def read_azure(path: Path) -> list[tuple[int, int, int, None]]:
    """Rows of an Azure LLM inference trace as (offset_ns, prompt, output, None), offsets
    exact to the trace's 100 ns resolution, from the first row."""
    rows = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        for line, row in enumerate(reader, start=2):
            try:
                stamp, _, frac = row["TIMESTAMP"].partition(".")
                whole = datetime.fromisoformat(stamp).replace(tzinfo=UTC)
                ns = int(whole.timestamp()) * 1_000_000_000 + int(frac.ljust(9, "0")[:9] or 0)
                rows.append((ns, int(row["ContextTokens"]), int(row["GeneratedTokens"]), None))
            except (KeyError, ValueError, TypeError) as exc:
                raise ScenarioError(f"{path}:{line}: bad Azure trace row: {exc}") from None
    return _relative(rows, path)


def read_mooncake(path: Path) -> list[tuple[int, int, int, list[int]]]:
    """Rows of a Mooncake JSONL trace as (offset_ns, prompt, output, hash_ids); timestamps
    are milliseconds."""
    rows = []
    with open(path) as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
                rows.append((int(item["timestamp"]) * 1_000_000, int(item["input_length"]),
                             int(item["output_length"]), [int(h) for h in item["hash_ids"]]))
            except (KeyError, ValueError, TypeError) as exc:
                raise ScenarioError(f"{path}:{line}: bad Mooncake trace row: {exc}") from None
    return _relative(rows, path)


def _relative(rows: list, path: Path) -> list:
    if not rows:
        raise ScenarioError(f"{path}: the trace has no rows")
    rows.sort(key=lambda r: r[0])
    first = rows[0][0]
    return [(ns - first, *rest) for ns, *rest in rows]
