"""Raw telemetry to derived tables. ``pipeline.schema`` and ``pipeline.storage`` are leaves
that every other package may import; the rest of ``pipeline`` is the job code.

Importing the package also sets Polars' allocator default (:data:`POLARS_MALLOC_CONF`); it must
run before Polars loads, and every process that runs pipeline stages imports this first.
"""

import os
import sys

#: jemalloc options of the Polars library (its prefixed ``MALLOC_CONF``), read once when Polars
#: allocates first. Polars puts its own default first (``dirty_decay_ms:500,muzzy_decay_ms:1000``,
#: polars issue 18088; later options win): freed pages go back to the kernel within a second,
#: so each hour's frames fault fresh zeroed pages in again. Keeping them 10 s (jemalloc's own
#: default) halves the page faults and the system time: a day of the pipeline benchmark
#: 57.5 -> 51.9 s wall, peak RSS 2.2 -> 2.5 GiB (``docs/benchmarks-history.md``). jemalloc returns
#: pages lazily, on later allocations, once they are 10 s old, so a long-running process
#: (``--follow``, the dashboard) may hold its recent peak that much longer.
POLARS_MALLOC_CONF = "dirty_decay_ms:10000,muzzy_decay_ms:10000"

#: What Polars' import writes when nobody set the variable (polars/__init__.py).
_POLARS_OWN_DEFAULT = "dirty_decay_ms:500,muzzy_decay_ms:1000"
_VARIABLE = "_RJEM_MALLOC_CONF"

if "polars" in sys.modules and os.environ.get(_VARIABLE) == _POLARS_OWN_DEFAULT:
    # Polars was imported first and wrote its default: too late for this process, but the
    # processes it starts (benchmark runs, workers) get ours.
    os.environ[_VARIABLE] = POLARS_MALLOC_CONF
else:
    os.environ.setdefault(_VARIABLE, POLARS_MALLOC_CONF)  # an operator's own setting wins
