"""glibc malloc settings of a collector worker, applied before anything starts a thread.

A module of its own, importing nothing heavy: the supervisor calls
:func:`limit_malloc_arenas` in a worker before the worker imports pyarrow, whose import
already starts threads (2 with pyarrow 26) that allocate.
"""

from __future__ import annotations

import ctypes
import os

#: glibc malloc arenas per worker: the default (8 per core) inflates RSS with gRPC's threads.
#: One: the Python threads take turns on the GIL anyway, and each arena keeps its own freed
#: pages (32 connections, issue 34: 5-10 MiB less per worker than with 2, same spans/s).
MALLOC_ARENAS = 1
_M_ARENA_MAX = -8  # mallopt parameter number (malloc.h)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> None:
    """Cap glibc's malloc arenas for the threads this process starts from now on.

    Call it before any thread allocates: glibc gives each thread that first allocates while
    no cap is set an arena of its own, and once an arena exists, the cap only makes later
    threads share the arenas there are. ``import pyarrow`` starts threads, so a call after
    it left every worker with 2 arenas (20-30 MiB of a worker's heap in the second, a third
    of it free but resident, issue 34).

    ``mallopt`` rather than ``MALLOC_ARENA_MAX`` in the environment: glibc reads that only
    when a program starts, and workers are forked. An explicit ``MALLOC_ARENA_MAX`` wins.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        return  # not glibc: nothing to tune
