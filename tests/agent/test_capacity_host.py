"""tests/agent/capacity_host.py (issue 31's real-vLLM capacity run): what processes outside
the test took of its CPU is told from what the test's own process tree took.

Both cases measure a busy loop on one CPU against its own CPU time from ``/proc``: one
orphaned (outside the tree: its time is other processes'), one a child (inside: its time is
the test's). Each bound holds whatever else the shared host runs on that CPU, and each
fails where the tree's time is misattributed. A second each; no lock needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.agent.capacity_host import _HZ, NS, HostSampler

BUSY = "while True: pass"
#: jiffies, sample edges and the reading of the loop's own time around the sampler's
SLACK = 0.1


def _cpu() -> int:
    """A CPU this process may run on (the last: the capacity run pins itself to CPU 0)."""
    return max(os.sched_getaffinity(0))


def _jiffies(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return sum(int(v) for v in text[text.rindex(")") + 2:].split()[11:13])


@contextmanager
def _busy(orphan: bool) -> Iterator[int]:
    """A busy loop pinned to :func:`_cpu`, a child of this process or (``orphan``) of a
    shell that exits at once (reparented: outside this process's tree); its pid."""
    if orphan:
        shell = subprocess.run(
            ["sh", "-c", f"{sys.executable} -c '{BUSY}' >/dev/null 2>&1 & echo $!"],
            capture_output=True, text=True, check=True)
        pid, child = int(shell.stdout), None
    else:
        child = subprocess.Popen([sys.executable, "-c", BUSY])
        pid = child.pid
    try:
        os.sched_setaffinity(pid, {_cpu()})
        time.sleep(0.3)  # started: the interpreter's own start is not the loop's
        yield pid
    finally:
        os.kill(pid, signal.SIGKILL)
        if child is not None:
            child.wait()


def _measure(pid: int, seconds: float = 1.0) -> tuple[float, float]:
    """(the others' share :class:`HostSampler` saw on the CPU, the loop's own share) over
    ``seconds`` (the sampler's entry and exit samples only)."""
    sampler = HostSampler(every_s=3600.0)
    sampler.cpus = {_cpu()}
    before = _jiffies(pid)
    with sampler:
        time.sleep(seconds)
    after = _jiffies(pid)
    lo, hi = sampler.samples[0][0], sampler.samples[-1][0]
    share = (after - before) / _HZ / ((hi - lo) / NS)
    others = sampler.others(lo, hi)
    assert others is not None
    return others, share


def test_a_process_outside_the_tree_counts_as_others() -> None:
    with _busy(orphan=True) as pid:
        others, share = _measure(pid)
    assert share > 0.2, f"the loop barely ran ({share:.2f} of the CPU): nothing told"
    assert others >= share - SLACK, (others, share)


def test_the_trees_own_processes_do_not() -> None:
    with _busy(orphan=False) as pid:
        others, share = _measure(pid)
    assert share > 0.2, f"the loop barely ran ({share:.2f} of the CPU): nothing told"
    # the CPU's time is the loop's, the others' and idle: never more than what is left
    assert others <= 1.0 - share + SLACK, (others, share)


def test_calm_leaves_out_a_busy_slice_and_a_second_either_side() -> None:
    """Samples every second of 10 s, the others busy (60% of the CPU) in the fifth only."""
    sampler = HostSampler()
    sampler.cpus = {0}
    busy = 0
    for s in range(11):
        sampler.samples.append((s * NS, busy, 0, 0))
        busy += int(0.6 * _HZ) if s == 4 else 0
    shares = [share for _, _, share in sampler.slices(0, 10 * NS, 1.0)]
    assert shares[4] == pytest.approx(0.6, abs=0.02) and max(shares[:4] + shares[5:]) == 0
    calm = sampler.calm([(0, 10 * NS)], 0.1, [(0, 10 * NS)])
    assert calm == [(0, 3 * NS), (6 * NS, 10 * NS)]
