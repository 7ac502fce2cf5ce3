"""Process measurements for ``bench/ingest.py``: memory (RSS, PSS), CPU time and the client
connections of a process tree, from ``/proc`` and ``ss``."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from pathlib import Path


def memory_by_pid(pid: int) -> dict[int, tuple[float, float]]:
    """(RSS, PSS) in MiB of a process and each of its descendants, by pid.

    RSS counts shared library pages once per process; PSS splits them between the
    processes that share them, so the PSS sum is what the collector as a whole uses.
    """
    out: dict[int, tuple[float, float]] = {}
    for p in tree(pid):
        rss = pss = 0
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[p] = (rss / 1024, pss / 1024)
    return out


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process and all its descendants, MiB."""
    by_pid = memory_by_pid(pid).values()
    return sum(r for r, _ in by_pid), sum(p for _, p in by_pid)


def tree(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(x) for x in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants."""
    ticks = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def busiest_worker_connections(address: str, pids: list[int]) -> float:
    """Client connections held by the busiest worker (SO_REUSEPORT hashes each connection
    to one worker for its whole life, so 4 clients on 2 workers split 2/2 only 3 times in 8).
    NaN when ``ss`` cannot tell."""
    port = address.rsplit(":", 1)[1]
    try:
        out = subprocess.run(["ss", "-tnpH", "state", "established", f"sport = :{port}"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return float("nan")
    owners = [int(line.split("pid=")[1].split(",")[0]) for line in out.splitlines()
              if "pid=" in line]
    counts = [owners.count(p) for p in pids]
    return float(max(counts)) if owners else float("nan")


def rss_mib(pid: int) -> float:
    return memory_mib(pid)[0]


def export_seconds(metrics_address: str) -> dict[str, float]:
    """The collector's own Export histogram (time inside its handler, all workers), read from
    its self-metrics: ``mean`` seconds and ``p99_le``, the bucket bound the 99th percentile
    falls under (inf past the last bound), and ``fsyncs_per_export``: WAL fdatasyncs (as of
    each worker's last flush) per Export answered. NaN when the endpoint cannot be read."""
    prefix = "fleetlens_collector_export_seconds"
    nan = {"mean": float("nan"), "p99_le": float("nan"), "fsyncs_per_export": float("nan")}
    try:
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return nan
    buckets: list[tuple[float, float]] = []
    total = count = fsyncs = 0.0
    for line in text.splitlines():
        if line.startswith(prefix + "_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound), float(line.rsplit(" ", 1)[1])))
        elif line.startswith(prefix + "_sum "):
            total = float(line.split()[1])
        elif line.startswith(prefix + "_count "):
            count = float(line.split()[1])
        elif line.startswith("fleetlens_collector_wal_fsyncs_total "):
            fsyncs = float(line.split()[1])
    if not count:
        return nan
    p99 = next((bound for bound, seen in buckets if seen >= 0.99 * count), float("inf"))
    return {"mean": total / count, "p99_le": p99, "fsyncs_per_export": fsyncs / count}


def rows_by_writer(paths: list[Path]) -> dict[str, int]:
    """Rows of raw Parquet segments per writer id (``<writer>-<seq>.parquet``): what each
    worker decoded."""
    import pyarrow.parquet as pq

    out: dict[str, int] = {}
    for path in paths:
        writer = path.stem.rsplit("-", 1)[0]
        out[writer] = out.get(writer, 0) + pq.ParquetFile(path).metadata.num_rows
    return out
