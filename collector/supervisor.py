"""Runs the collector's worker processes and restarts any that die.

With one worker the collector is a single process. With more, each worker is a forked
process serving the same ports (SO_REUSEPORT): the kernel spreads connections over them, so
decoding uses every core. SIGTERM is forwarded; workers drain and flush before they exit.
A restarted worker replays the WAL its predecessor left.

Fork, not spawn: the supervisor has no threads and has imported neither Arrow nor gRPC, so a
forked worker starts from a clean, small interpreter, and no multiprocessing resource-tracker
process is needed (spawn starts one: about 12 MiB of RSS for nothing).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable

from fleetlens.collector import balance_board
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.descriptors import raise_open_files_limit
from fleetlens.collector.import_guard import keep_out, kept_out
from fleetlens.collector.preflight import check_ports_free, warn_if_exposed
from fleetlens.collector.process_memory import limit_malloc_arenas
from fleetlens.collector.self_metrics import bind
from fleetlens.collector.telemetry import log, shared_array

RESTART_DELAY_S = 0.5
#: pyarrow's filesystem bindings, which ``import pyarrow.parquet`` loads through ``pyarrow.fs``
#: (each optional there). A worker writes Parquet to local files and reaches object stores
#: through obstore, so it never uses them; ``libarrow_s3`` alone is 3.6 MiB of RSS per worker.
UNUSED_ARROW_MODULES = ("pyarrow._s3fs", "pyarrow._gcsfs", "pyarrow._azurefs", "pyarrow._hdfs")
#: Modules that importing the worker would load and the worker never uses.
WORKER_IMPORTS_WITHOUT = ("numpy",)
#: A worker that dies this soon after starting, this many times in a row, stops the collector.
QUICK_FAILURE_S = 10.0
MAX_QUICK_FAILURES = 3


def prepare_worker() -> Callable[..., None]:
    """Set up a worker process before it imports the worker module; returns ``run_worker``.

    In a forked worker, or in the one process when there is a single worker.
    """
    # A forked worker inherits the supervisor's handlers, which would swallow a SIGTERM that
    # arrives before run_worker installs its own: until then, end as a fresh process would.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    # Before the worker module imports pyarrow, whose import starts threads that allocate.
    limit_malloc_arenas()
    # Before the worker module imports pyarrow.parquet, which would load them; pandas (and
    # with it numpy), which pyarrow would import at its first conversion, as run_worker
    # does too (worker.keep_out_pandas).
    keep_out(*UNUSED_ARROW_MODULES, "pandas")
    # Imported here so the supervisor itself stays small (no Arrow, DuckDB or gRPC), and
    # without numpy, which pyarrow imports if it can and a worker does not use: about
    # 11 MiB of RSS per worker (issue 34). Only replaying a damaged WAL file imports it.
    with kept_out(*WORKER_IMPORTS_WITHOUT):
        from fleetlens.collector.worker import run_worker
    return run_worker


def _worker_main(*args: object) -> None:
    prepare_worker()(*args)


def worker_count(config: CollectorConfig) -> int:
    """``config.workers``, or one per available core when 0."""
    if config.workers:
        return config.workers
    return max(1, len(os.sched_getaffinity(0)))


def run(config: CollectorConfig, root: str) -> None:
    """Serve until SIGTERM/SIGINT with ``worker_count(config)`` processes."""
    count = worker_count(config)
    warn_if_exposed(config)
    check_ports_free(config)  # one clear line instead of every worker failing in turn
    config.forward.check_files()  # likewise for the edge's TLS files
    raise_open_files_limit()  # before the workers fork: they inherit it
    # Arrow's default mimalloc pool keeps freed pages; the system allocator gives them back
    # (about 70 MiB less RSS under load). Read when Arrow first allocates, so set it first.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    # Bound once, here: every worker accepts on it (see collector/self_metrics.py).
    metrics_sock = bind(config.self_metrics_address) if config.self_metrics_address else None
    if count == 1:
        _worker_main(config, root, 0, None, None, metrics_sock)
        return
    context = multiprocessing.get_context("fork")
    array = shared_array(count)
    peers = balance_board.create(count) if config.balance_exports else None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def start(slot: int) -> multiprocessing.process.BaseProcess:
        process = context.Process(target=_worker_main, name=f"collector-worker-{slot}",
                                  args=(config, root, slot, array, os.getpid(), metrics_sock,
                                        peers))
        process.start()
        return process

    workers = [start(slot) for slot in range(count)]
    started = [time.monotonic()] * count
    quick_failures = [0] * count
    log.info("collector supervisor %d started %d workers", os.getpid(), count)
    failed = False
    while not failed and not stop.wait(0.2):
        for slot, process in enumerate(workers):
            if process.is_alive():
                continue
            log.error("worker %d exited with %s; restarting", slot, process.exitcode)
            quick = time.monotonic() - started[slot] < QUICK_FAILURE_S
            quick_failures[slot] = quick_failures[slot] + 1 if quick else 0
            if quick_failures[slot] >= MAX_QUICK_FAILURES:
                failed = True  # e.g. a port in use or unreadable certificates: no crash loop
                break
            if peers is not None:  # peers stop handing it Exports until its successor serves
                peers.set_serving(slot, False)
                peers.set_running(slot, 0)
            time.sleep(RESTART_DELAY_S)
            workers[slot], started[slot] = start(slot), time.monotonic()
    for process in workers:
        if process.is_alive() and process.pid:
            os.kill(process.pid, signal.SIGTERM)
    for process in workers:
        process.join()
    if peers is not None:
        balance_board.remove(peers)
    if failed:
        raise RuntimeError(f"a worker failed {MAX_QUICK_FAILURES} times right after starting; "
                           "see the log above")
    log.info("collector supervisor stopped")
