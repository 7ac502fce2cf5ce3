"""An open-loop load generator on a single asyncio loop (threads get starved by vLLM on 2
cores; one loop sends on time), speaking plain HTTP/1.1 to the OpenAI completions API."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from dataclasses import dataclass, field

WORDS = ("the quick brown fox jumps over the lazy dog inference fleets serve many requests "
         "per second on many gpus a key value cache holds attention state for every running "
         "sequence queue time prefill time and decode time add up to the request latency").split()


@dataclass
class Request:
    """One planned completion."""

    at_s: float  # offset from the start of the run
    prompt: str
    max_tokens: int
    traceparent: tuple[str, str] | None = None  # (trace_id, parent span_id), lowercase hex
    response: dict = field(default_factory=dict)
    status: int = 0
    sent_at: float = 0.0
    lag_s: float = 0.0
    latency_s: float = 0.0  # client-side, from sending to the whole answer

    @property
    def span_request_id(self) -> str:
        """vLLM's span ``gen_ai.request.id``: the response ``id`` plus ``-0``."""
        return f"{self.response['id']}-0"


def prompt_of(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def new_traceparent() -> tuple[str, str]:
    """A fresh (trace_id, parent span_id) as a caller's trace would have."""
    return secrets.token_hex(16), secrets.token_hex(8)


async def _post(port: int, req: Request, timeout_s: float) -> None:
    body = json.dumps({"model": "tiny", "prompt": req.prompt, "max_tokens": req.max_tokens,
                       "ignore_eos": True, "temperature": 0.8}).encode()
    headers = ["POST /v1/completions HTTP/1.1", f"Host: 127.0.0.1:{port}",
               "Content-Type: application/json", f"Content-Length: {len(body)}",
               "Connection: close"]
    if req.traceparent:
        trace_id, span_id = req.traceparent
        headers.append(f"traceparent: 00-{trace_id}-{span_id}-01")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    req.status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        payload = _dechunk(payload)
    req.response = json.loads(payload) if req.status == 200 else {"error": payload[:500]}


def _dechunk(data: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end], 16)
        if size == 0:
            return out
        out += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


async def _run(port: int, plan: list[Request], timeout_s: float) -> None:
    start = time.monotonic()

    async def one(req: Request) -> None:
        await asyncio.sleep(max(0.0, req.at_s - (time.monotonic() - start)))
        req.sent_at = time.monotonic() - start
        req.lag_s = req.sent_at - req.at_s
        await _post(port, req, timeout_s)
        req.latency_s = time.monotonic() - start - req.sent_at

    await asyncio.gather(*(one(r) for r in plan))


def poisson(rng: random.Random, rate: float, start_s: float, end_s: float) -> list[float]:
    """Arrival offsets of a Poisson process of ``rate`` per second in [start_s, end_s): the
    open-loop arrivals of many independent clients."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    out, at = [], start_s
    while True:
        at += rng.expovariate(rate)
        if at >= end_s:
            return out
        out.append(at)


def run(port: int, plan: list[Request], timeout_s: float = 180.0) -> list[Request]:
    """Send every request of ``plan`` at its offset; returns the plan with responses."""
    asyncio.run(_run(port, plan, timeout_s))
    return plan
