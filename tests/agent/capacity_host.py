"""What else ran on the real-vLLM capacity run's cores (``tests/agent/test_vllm_capacity.py``,
issue 31): the share of its CPUs that processes outside the test took, slice by slice.

On a shared host other work takes the server's core for seconds at a time (a run's low
phase: TTFT 60-130 ms for 5 s against 5-7 ms before and after, TPOT 7 ms against 2). Those
seconds are the host's, not the engine's: a twin calibrated on them predicts a slower
engine, a higher-rate phase measured in them a slower one than any model of the engine can
know. They are told here independently of the engine's own timings: from ``/proc/stat``,
the busy time of the CPUs the test may run on, less the CPU time of the test's own process
tree (the test, its server, agent and collector: all kept on those CPUs by their affinity),
plus the hypervisor's steal. What is left is other processes'.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

NS = 1_000_000_000
_HZ = os.sysconf("SC_CLK_TCK")


def _cpu_times(cpus: set[int]) -> tuple[int, int]:
    """(busy, steal) jiffies summed over ``cpus`` (busy: user, nice, system, irq, softirq)."""
    busy = steal = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, st = (int(v) for v in values[:8])
            busy += user + nice + system + irq + softirq
            steal += st
    return busy, steal


def _tree_jiffies(root: int) -> int:
    """CPU jiffies of ``root`` and its descendants (their own and their reaped children's)."""
    parent: dict[int, int] = {}
    spent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # the command name may hold spaces and parentheses: fields follow its last ')'
        fields = text[text.rindex(")") + 2:].split()
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        spent[pid] = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    ours, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in ours:
                ours.add(child)
                frontier.append(child)
    return sum(spent.get(pid, 0) for pid in ours)


@dataclass
class HostSampler:
    """Samples, every ``every_s`` in a thread, the CPU taken by processes outside this one's
    tree on the CPUs this process may run on (module docstring)."""

    every_s: float = 0.5
    samples: list[tuple[int, int, int, int]] = field(default_factory=list)  # ns, busy, steal, ours
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.cpus = os.sched_getaffinity(0)
        self.root = os.getpid()

    def _sample(self) -> None:
        busy, steal = _cpu_times(self.cpus)
        self.samples.append((time.time_ns(), busy, steal, _tree_jiffies(self.root)))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> HostSampler:
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def others(self, lo: int, hi: int) -> float | None:
        """The share of the CPUs that other processes (and steal) took over ``[lo, hi)``
        (ns), between the samples that bracket it (the last at or before ``lo``, the first
        at or after ``hi``); None where none brackets it."""
        before = [s for s in self.samples if s[0] <= lo]
        after = [s for s in self.samples if s[0] >= hi]
        if not before or not after:
            return None
        (t0, b0, s0, o0), (t1, b1, s1, o1) = before[-1], after[0]
        capacity = (t1 - t0) / NS * _HZ * len(self.cpus)
        return max((b1 - b0) + (s1 - s0) - (o1 - o0), 0) / capacity

    def calm(self, spans: list[tuple[int, int]], limit: float, over: list[tuple[int, int]],
             slice_s: float = 1.0, margin_s: float = 1.0) -> list[tuple[int, int]]:
        """``spans`` (ns) less each ``slice_s`` slice of the ``over`` spans in which other
        processes took more than ``limit`` of the CPUs (or not measured), widened by
        ``margin_s`` either side: the requests that arrived just before it ran into it,
        those just after found its backlog."""
        margin = int(margin_s * NS)
        bad = [(lo - margin, hi + margin) for span in over
               for lo, hi, share in self.slices(*span, slice_s)
               if share is None or share > limit]
        out = []
        for lo, hi in spans:
            pieces = [(lo, hi)]
            for b_lo, b_hi in bad:
                pieces = [p for a, b in pieces for p in ((a, min(b, b_lo)), (max(a, b_hi), b))
                          if p[1] > p[0]]
            out += pieces
        return out

    def slices(self, lo: int, hi: int, slice_s: float) -> list[tuple[int, int, float | None]]:
        """``[lo, hi)`` in slices of ``slice_s``: (start, end, :meth:`others`) each."""
        step = int(slice_s * NS)
        return [(s, min(s + step, hi), self.others(s, min(s + step, hi)))
                for s in range(lo, hi, step)]


def settle(pid: int, share: float = 0.1, every_s: float = 1.0, timeout_s: float = 30.0) -> float:
    """Wait until process ``pid`` and its children use less than ``share`` of a CPU over
    ``every_s`` (a just started agent imports and connects for seconds on the server's core),
    at most ``timeout_s``; the seconds waited."""
    start = time.monotonic()
    last = _tree_jiffies(pid)
    while time.monotonic() - start < timeout_s:
        time.sleep(every_s)
        now = _tree_jiffies(pid)
        if (now - last) / _HZ / every_s < share:
            break
        last = now
    return time.monotonic() - start
