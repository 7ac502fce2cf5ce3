"""Instance -> GPU mapping: from config, or from the PIDs NVML reports on each GPU.

A vLLM server is found by the port of its URL: the process listening on that local port
(``/proc/net/tcp*`` socket inode -> ``/proc/<pid>/fd``) and all its descendants (vLLM V1 runs
the engine, the process that holds the GPU, as a child). A GPU serves the instance when one of
those PIDs is among the GPU's compute processes. In a container this needs the host PID
namespace (``hostPID: true``), because NVML reports host PIDs.

With dcgm-exporter as the GPU source there are no PIDs, but there are pods: a target with
``pod`` set is served by the GPUs whose ``namespace``/``pod`` labels name that pod.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from fleetlens.collector.agent.sampler import GpuSample

log = logging.getLogger(__name__)
PROC = Path("/proc")
#: Ports already reported as unreadable (said once, not every mapping refresh).
_DENIED_REPORTED: set[int] = set()
_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1],
                                                                16) == port:
                inodes.add(fields[9])
    return inodes


def _pids(proc: Path) -> list[int]:
    return [int(p.name) for p in proc.iterdir() if p.name.isdigit()]


def listening_pids(port: int, proc: Path = PROC) -> set[int]:
    """PIDs holding a socket listening on TCP ``port`` (those whose fds this user can see)."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return set()
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found = set()
    denied = 0
    for pid in _pids(proc):
        try:
            fds = os.scandir(proc / str(pid) / "fd")
        except PermissionError:
            denied += 1
            continue
        except OSError:
            continue  # the process ended meanwhile
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) in wanted:
                        found.add(pid)
                        break
                except OSError:
                    continue
    if not found and denied and port not in _DENIED_REPORTED:
        _DENIED_REPORTED.add(port)
        log.warning("port %d is listening but its process is not readable here (%d "
                    "processes' fds denied): run the agent as root with SYS_PTRACE, or list "
                    "the instance's GPUs in [[agent.vllm]] gpus", port, denied)
    return found


def with_descendants(roots: Iterable[int], proc: Path = PROC) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid in _pids(proc):
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            continue
        # the command name may contain spaces and parentheses: the ppid follows the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(pid)
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def url_port(url: str) -> int:
    """The TCP port of an http(s) URL (default 80/443)."""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def gpus_from_config(entries: Iterable[str], samples: list[GpuSample]) -> tuple[str, ...]:
    """Resolve configured GPUs (indices or UUIDs) to UUIDs; an unknown UUID is kept as given."""
    by_index = {str(s.index): s.uuid for s in samples}
    return tuple(sorted({by_index.get(e.strip(), e.strip()) for e in entries
                         if not (e.strip().isdigit() and e.strip() not in by_index)}))


def gpus_from_pids(pids: set[int], samples: list[GpuSample]) -> tuple[str, ...]:
    """UUIDs of the GPUs running any of ``pids``."""
    return tuple(sorted({s.uuid for s in samples if pids & set(s.pids)}))


def gpus_from_pod(pod: str, samples: list[GpuSample]) -> tuple[str, ...]:
    """UUIDs of the GPUs dcgm-exporter shows in use by ``pod``: ``namespace/name``, or a bare
    ``name`` (any namespace)."""
    def matches(seen: str) -> bool:
        return seen == pod or ("/" not in pod and seen.rpartition("/")[2] == pod)
    return tuple(sorted({s.uuid for s in samples if any(matches(p) for p in s.pods)}))
