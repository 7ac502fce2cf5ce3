"""The load generator of ``bench/ingest.py``: client processes, each holding several OTLP/gRPC
connections, started behind a barrier.

Why it is shaped this way (issue 16, 32 connections):

- **Barrier.** Every process builds its requests and connects *before* the schedule starts,
  then waits for the start time the parent sets once all are ready. The old generator gave
  its clients a fixed 4 s head start: 32 Python processes importing gRPC on 2 shared cores
  took 10-20 s, so whole clients started seconds late, and open-loop latency (counted from
  the schedule) charged that start-up to the collector: a p99 of seconds with a p50 of
  100-200 ms.
- **Several connections per process.** A connection is a gRPC channel with its own
  subchannel pool (``grpc.use_local_subchannel_pool``: channels with equal arguments would
  otherwise share one TCP connection). 32 connections from 4 processes cost the shared cores
  far less than 32 interpreters, each with gRPC's polling threads.
- **Phases.** In open loop every connection sends at ``rate`` requests/s. With a common
  origin (``aligned``) all 32 connections send in the same instant, every 1/rate s: bursts
  of 32 requests (16,384 spans) that no fleet of independent exporters produces. By default
  each connection starts at a random (seeded) point of its interval, as independent
  exporters' timers do; ``aligned=True`` keeps the lockstep worst case.
"""

from __future__ import annotations

import heapq
import queue as queue_module
import random
import threading
import time
from typing import Any

SPANS_PER_REQUEST = 512
DISTINCT_REQUESTS = 8
#: Open loop: requests a connection lets wait for their answers before it holds back.
MAX_IN_FLIGHT = 64


def split(connections: int, processes: int) -> list[list[int]]:
    """Connection numbers 0..connections-1 dealt round-robin over at most ``processes``."""
    processes = max(1, min(processes, connections))
    return [list(range(k, connections, processes)) for k in range(processes)]


def _channel(address: str) -> Any:
    import grpc

    return grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.use_local_subchannel_pool", 1)])  # one TCP connection per channel


def _open_loop(calls: list[Any], payloads: list[list[bytes]], origin: float, seconds: float,
               rate: float, phases: list[float]) -> tuple[list[float], int]:
    """Send on every connection ``rate`` requests/s from ``origin`` (perf_counter) plus its
    phase; a latency counts from the scheduled send time, never from the actual one."""
    latencies: list[float] = []
    refused = [0]
    interval = 1.0 / rate
    slots = [threading.Semaphore(MAX_IN_FLIGHT) for _ in calls]
    # one merged schedule: (time, connection, index), earliest first
    due = [(origin + phases[k] * interval, k, 0) for k in range(len(calls))
           if phases[k] * interval < seconds]
    heapq.heapify(due)
    while due:
        scheduled, k, i = heapq.heappop(due)
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        slots[k].acquire()

        def finished(future: Any, scheduled: float = scheduled, k: int = k) -> None:
            if future.exception() is None:
                latencies.append(time.perf_counter() - scheduled)
            else:
                refused[0] += 1
            slots[k].release()

        calls[k].future(payloads[k][i % DISTINCT_REQUESTS], timeout=30).add_done_callback(
            finished)
        # from the index, not by adding intervals: (t + 1/3) + 1/3 + 1/3 can fall short of
        # t + 1 and schedule one more request than rate x seconds
        offset = (phases[k] + i + 1) * interval
        if offset < seconds:
            heapq.heappush(due, (origin + offset, k, i + 1))
    for slot in slots:  # wait for the last answers
        for _ in range(MAX_IN_FLIGHT):
            slot.acquire()
    return latencies, refused[0]


def _closed_loop(call: Any, payloads: list[bytes], start_at: float, seconds: float,
                 out: list[Any]) -> None:
    import grpc

    latencies: list[float] = []
    refused, i = 0, 0
    deadline = start_at + seconds
    while time.time() < deadline:
        began = time.perf_counter()
        try:
            call(payloads[i % DISTINCT_REQUESTS], timeout=30)
            latencies.append(time.perf_counter() - began)
        except grpc.RpcError:
            refused += 1
            time.sleep(0.01)
        i += 1
    out.append((latencies, refused))


def client_process(address: str, connections: list[int], ready: Any, start: Any,
                   seconds: float, queue: Any, rate: float = 0.0, aligned: bool = False,
                   seed: int = 0, inflight: int = 1) -> None:
    """One load-generator process holding one gRPC connection per number in ``connections``.

    Builds ``DISTINCT_REQUESTS`` requests per connection, connects, puts its pid on ``ready``
    and waits until ``start.value`` (a wall-clock time) is set. Then runs closed loops (one
    thread per connection) or, with ``rate`` (requests/s per connection), one open-loop
    schedule. Puts ``(latencies, refused, cpu_seconds)`` on ``queue``; the CPU time is this
    process's (all threads) during the measured part only. ``inflight``: closed-loop threads
    per connection, i.e. Exports each connection keeps in flight (an OpenTelemetry
    Collector's exporter keeps up to ``num_consumers``, default 10, on one connection).
    """
    import os

    import grpc

    from fleetlens.collector.signals import SPANS
    from fleetlens.collector.testing import vllm_trace_request

    payloads = [[vllm_trace_request(SPANS_PER_REQUEST, seed=n * 100 + i).SerializeToString()
                 for i in range(DISTINCT_REQUESTS)] for n in connections]
    channels = [_channel(address) for _ in connections]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=120)
    calls = [ch.unary_unary(SPANS.grpc_method, request_serializer=None,
                            response_deserializer=SPANS.response.FromString)
             for ch in channels]
    ready.put(os.getpid())
    while not start.value:
        time.sleep(0.005)
    start_at = start.value
    while time.time() < start_at:
        time.sleep(0.001)
    cpu_before = time.process_time()
    if rate:
        rng = random.Random(seed * 7919 + connections[0])
        phases = [0.0 if aligned else rng.random() for _ in connections]
        origin = time.perf_counter() + (start_at - time.time())
        latencies, refused = _open_loop(calls, payloads, origin, seconds, rate, phases)
    else:
        out: list[Any] = []
        threads = [threading.Thread(target=_closed_loop, args=(c, p, start_at, seconds, out))
                   for c, p in zip(calls, payloads, strict=True) for _ in range(inflight)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        latencies = [x for lat, _ in out for x in lat]
        refused = sum(r for _, r in out)
    cpu = time.process_time() - cpu_before
    for channel in channels:
        channel.close()
    queue.put((latencies, refused, cpu))


def start_clients(address: str, connections: int, processes: int, seconds: float,
                  rate: float = 0.0, aligned: bool = False, seed: int = 0,
                  ready_timeout: float = 300.0,
                  inflight: int = 1) -> tuple[list[Any], Any, float]:
    """Start the generator, wait until every connection is up, and set the start time.

    ``rate``: requests/s per connection (0: closed loop). Returns (processes, result queue,
    start time); each process puts one result on the queue.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    queue, ready = context.Queue(), context.Queue()
    start = context.Value("d", 0.0)
    procs = [context.Process(target=client_process, args=(
        address, group, ready, start, seconds, queue, rate, aligned, seed, inflight))
        for group in split(connections, processes)]
    for proc in procs:
        proc.start()
    waiting, deadline = len(procs), time.monotonic() + ready_timeout
    while waiting:
        try:
            ready.get(timeout=1.0)
            waiting -= 1
        except queue_module.Empty:
            if any(proc.exitcode is not None for proc in procs) or time.monotonic() > deadline:
                for proc in procs:
                    proc.kill()
                raise RuntimeError("a load-generator process failed before it was ready") from None
    start_at = time.time() + 0.5
    start.value = start_at
    return procs, queue, start_at


class _Fixed:
    """A start time known in advance (what ``client_process`` reads from ``start.value``)."""

    def __init__(self, value: float) -> None:
        self.value = value


class _NoReady:
    """Nobody waits for this client to be ready."""

    def put(self, item: Any) -> None:
        return None


class _Pairs:
    """Puts ``(latencies, refused)`` on ``queue``, dropping the CPU figure."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def put(self, item: tuple[Any, ...]) -> None:
        self.queue.put(item[:2])


def single_client(address: str, seed: int, start_at: float, seconds: float, queue: Any,
                  rate: float = 0.0) -> None:
    """One connection from ``start_at`` (wall clock, fixed in advance), closed loop or open
    loop at ``rate`` requests/s; puts ``(latencies, refused)``. For callers that spread
    clients over several collectors (bench/scale_store.py)."""
    client_process(address, [seed], _NoReady(), _Fixed(start_at), seconds,
                   _Pairs(queue), rate)
