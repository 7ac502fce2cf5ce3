"""Polars' allocator setting: set by importing ``pipeline``, reaching Polars, yielding to yours."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

_WORKLOAD = """
import resource
{first}
import numpy as np
import polars as pl
for _ in range(6):  # frames freed and allocated again, as the pipeline does hour by hour
    df = pl.DataFrame({{"a": np.arange(2_000_000), "b": np.random.rand(2_000_000)}})
    df.with_columns((pl.col("a") * 2).alias("c")).sort("b")
import os
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt, os.environ.get("_RJEM_MALLOC_CONF"))
"""


def _run(first: str, **env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", _WORKLOAD.format(first=first)], cwd=REPO,
                         env={**clean, **env}, capture_output=True, text=True, check=True)
    faults, conf = out.stdout.split()
    return int(faults), conf


def test_importing_pipeline_sets_the_polars_allocator_before_polars_loads():
    from fleetlens.pipeline import POLARS_MALLOC_CONF

    faults, conf = _run("import pipeline")
    # Polars prepends its own default; jemalloc takes the last value of each option.
    assert conf.endswith("," + POLARS_MALLOC_CONF)
    # The same work with jemalloc purging freed pages at once faults them in again every
    # time: the setting must really reach Polars' allocator (a count, not a timing).
    eager, _ = _run("import pipeline", _RJEM_MALLOC_CONF="dirty_decay_ms:0,muzzy_decay_ms:0")
    assert faults < 0.6 * eager, (faults, eager)


def test_an_operators_own_setting_wins():
    _, conf = _run("import pipeline", _RJEM_MALLOC_CONF="dirty_decay_ms:5000")
    assert conf.endswith(",dirty_decay_ms:5000")


def test_processes_started_after_polars_was_imported_first_get_the_setting():
    from fleetlens.pipeline import POLARS_MALLOC_CONF

    # e.g. bench/pipeline.py imports polars, then pipeline, then runs each pipeline in a child
    _, conf = _run("import polars, pipeline, subprocess, sys\n"
                   "conf = subprocess.run([sys.executable, '-c', 'import os; "
                   "print(os.environ[\"_RJEM_MALLOC_CONF\"])'], capture_output=True, text=True)"
                   ".stdout.strip()\n"
                   "import os; os.environ['_RJEM_MALLOC_CONF'] = conf")
    assert conf == POLARS_MALLOC_CONF
