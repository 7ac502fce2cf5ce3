"""``bench/accuracy.py`` stopped with SIGTERM stops the collector it started (it runs in a
session of its own, so nothing else would: session 14 found one left running after a draw
was killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out.append((int(entry.name), cmdline))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_terminated_run_stops_its_collector(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "bench/accuracy.py", "--suite", "random", "--fleets", "1",
         "--size", "small", "--keep", str(tmp_path)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    collector = None
    try:
        deadline = time.monotonic() + 120
        while collector is None and time.monotonic() < deadline and run.poll() is None:
            collector = next((pid for pid, cmd in _children(run.pid)
                              if " collector " in cmd), None)
            time.sleep(0.2)
        assert collector is not None, "the run started no collector within 120 s"
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while _alive(collector) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(collector), f"collector {collector} still running"
    finally:
        if run.poll() is None:
            run.kill()
        if collector is not None and _alive(collector):
            os.kill(collector, signal.SIGKILL)
