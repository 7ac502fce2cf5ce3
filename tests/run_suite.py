"""``make test``'s runner: the whole suite in three parts, laid out on the machine's cores.

The real-vLLM tests keep a CPU vLLM server busy for about 16 minutes (a timeline with 60 s
outages), and its engine spins on every core it may use whenever a request is in flight
(1.0 core at 2 requests/s of a tiny model, measured): beside the rest of the suite on the
same cores both starved (load 14-22: the agent's exports missed their deadline, a collector
did not listen in 60 s). Run one after the other they cost 16 + 9.5 minutes on 2 cores.

By default the vLLM part gets one core of its own (the server's threads bound to it with
``VLLM_CPU_OMP_THREADS_BIND``, every process of that part kept on it by its CPU affinity)
and the rest of the suite the other cores, at once: 16.5 (20.5 with issue 31's capacity
validation) and 18 minutes side by side on a 2-core AMD EPYC (docs/benchmarks.md). The
Ray and two-node tests then run alone on every core (a Ray cluster wants more than one).
With ``--serial`` (or a single core, or where CPU affinity cannot be set) the parts run one
after the other, about 34 minutes on 2 cores (28-30 before the capacity validation).

On its one core the tiny model's TTFT per token once rose 80 s into the steady load, and
the warm-up band's incident, with the production merge gap of 180 s over 10 s windows,
swallowed the surge two minutes later (1 run of 3); the diagnosis now scales the gap to
its windows (:func:`tests.agent.incident_run.diagnose`).

Usage: ``python tests/run_suite.py [--serial] [--workers N] [-- extra pytest arguments]``;
exits non-zero when any part failed, after running every part.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
#: The real-vLLM files: one core of their own (issue 31's capacity validation, the sweep,
#: passive knee and twin, about 3.8 of its minutes).
VLLM = ("tests/agent/test_vllm_e2e.py", "tests/agent/test_vllm_incidents.py",
        "tests/agent/test_vllm_capacity.py")
#: Ray clusters and the two-node object-store runs: alone, on every core, at the end.
ALONE = ("tests/analytics/test_ray_analyze.py", "tests/pipeline/test_ray_runner.py",
         "tests/pipeline/test_ray_shards.py", "tests/pipeline/test_object_store_e2e.py")


def pytest(args: Sequence[str], cpus: set[int] | None = None,
           env: dict[str, str] | None = None, output: IO[bytes] | None = None,
           ) -> subprocess.Popen:
    """Start pytest on ``args``, kept on ``cpus`` (inherited by every process it starts),
    writing to ``output`` (this process's stdout by default)."""
    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=REPO,
                            env={**os.environ, **(env or {})}, preexec_fn=pin,
                            stdout=output, stderr=subprocess.STDOUT if output else None)


def workers_args(workers: int) -> list[str]:
    """pytest-xdist's arguments for ``workers`` processes (none for one: no xdist at all)."""
    return ["-n", str(workers)] if workers > 1 else []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=0,
                        help="xdist workers for the rest of the suite (default: its cores)")
    parser.add_argument("--serial", action="store_true",
                        help="the parts one after the other, each on every core (about 34 "
                             "instead of 23 minutes on 2 cores), instead of the real-vLLM part "
                             "on one core beside the rest on the others")
    parser.add_argument("extra", nargs="*", help="more pytest arguments for every part")
    opts = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    rest = [*(f"--ignore={f}" for f in (*VLLM, *ALONE)), *opts.extra]
    vllm = list(VLLM)
    started = time.monotonic()
    results: dict[str, int] = {}
    if not opts.serial and len(cpus) >= 2:
        vllm_cpu, rest_cpus = cpus[0], set(cpus[1:])
        workers = opts.workers or len(rest_cpus)
        print(f"run_suite: the real-vLLM tests on CPU {vllm_cpu}, the rest on CPUs "
              f"{sorted(rest_cpus)} ({workers} worker(s)), at once", flush=True)
        # the vLLM part's report is printed whole when it ends, not interleaved with the rest's
        with tempfile.TemporaryFile() as vllm_log:
            parts = {
                "real vLLM": pytest([*vllm, *opts.extra], {vllm_cpu},
                                    {"VLLM_CPU_OMP_THREADS_BIND": str(vllm_cpu)}, vllm_log),
                "rest": pytest([*workers_args(workers), *rest], rest_cpus),
            }
            for name, proc in parts.items():
                results[name] = proc.wait()
                print(f"run_suite: {name} done after {time.monotonic() - started:.0f} s "
                      f"(exit {results[name]})", flush=True)
            vllm_log.seek(0)
            print("run_suite: the real-vLLM tests' report:", flush=True)
            sys.stdout.buffer.write(vllm_log.read())
            sys.stdout.flush()
    else:
        workers = opts.workers or len(cpus)
        print(f"run_suite: the parts one after the other, the rest on {workers} worker(s)",
              flush=True)
        results["real vLLM"] = pytest([*vllm, *opts.extra]).wait()
        results["rest"] = pytest([*workers_args(workers), *rest]).wait()
    results["Ray and two-node"] = pytest([*ALONE, *opts.extra]).wait()
    print(f"run_suite: {time.monotonic() - started:.0f} s in all; "
          + ", ".join(f"{k}: exit {v}" for k, v in results.items()), flush=True)
    # 5: pytest collected nothing, which only extra arguments (a -k filter) may explain
    passed = (0, 5) if opts.extra else (0,)
    return 0 if all(code in passed for code in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
