"""A real Ray cluster on this machine for tests: a head and worker nodes, each its own
``ray start --block`` process group, every node on 127.0.0.1 with one CPU.

Stopped by process group and by its own temp dir, never with ``ray stop`` (which ends every
Ray process of the machine, other engineers' included). Ray's fixed default ports (6379,
10001, 8265, 52365) are replaced by free ones, so two test runs do not collide.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
#: Ray refuses a GCS port inside its worker port range.
_WORKER_PORTS = range(10002, 20000)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 outside Ray's worker port range."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _WORKER_PORTS:
            return port


def ray_env() -> dict[str, str]:
    """Environment of the nodes and drivers: no token (loopback only), no usage stats."""
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


#: What ``ray start --head`` prints once its GCS, raylet and object store are up.
HEAD_STARTED = "Ray runtime started"


class RayCluster:
    """Head plus ``add_node()`` workers; ``address`` is the head's GCS address."""

    def __init__(self, env: dict[str, str] | None = None, node_args: tuple[str, ...] = ()
                 ) -> None:
        """``env``: more environment for every node (e.g. POLARS_MAX_THREADS); ``node_args``:
        more ``ray start`` arguments for every node (e.g. ``--object-store-memory``)."""
        self.env = {**ray_env(), **(env or {})}
        self.node_args = list(node_args)
        # Short: Ray's unix socket paths under it must stay under 108 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="flray", dir="/tmp"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen] = []

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        cmd = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
               "--dashboard-agent-listen-port", str(free_port()),
               "--dashboard-agent-grpc-port", str(free_port()),
               "--runtime-env-agent-port", str(free_port()),
               "--metrics-export-port", str(free_port()), *self.node_args, *args]
        # Own session: the node's processes share its process group, killed as one.
        with (self.temp_dir / f"{name}.log").open("w") as log:  # the child keeps its copy
            node = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.nodes.append(node)
        return node

    def start_head(self) -> subprocess.Popen:
        """Start the head and wait until it says its runtime started (its raylet is
        registered), not only until its GCS accepts connections: a driver that connects
        between the two gives up after Ray's 60 s ("No node info found matching
        attributes"), as two tests did in `make test` at a load average of 16."""
        head = self._start(["--head", "--port", str(self.port), "--temp-dir", str(self.temp_dir),
                            "--include-dashboard", "false", "--disable-usage-stats",
                            "--ray-client-server-port", str(free_port()),
                            "--dashboard-port", str(free_port())], "head")
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if head.poll() is not None:
                raise RuntimeError(f"ray head exited: {self.log('head')}")
            if HEAD_STARTED in (self.temp_dir / "head.log").read_text():
                socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                return head
            time.sleep(0.2)
        raise RuntimeError(f"ray head did not start in 240 s: {self.log('head')}")

    def add_node(self) -> subprocess.Popen:
        """Start a worker node (the caller waits for it to join, e.g. :func:`wait_nodes`)."""
        return self._start(["--address", self.address], f"node{len(self.nodes)}")

    def restart_exited(self) -> int:
        """Start again every worker node whose ``ray start`` exited (e.g. a port picked free
        and taken by another process before Ray bound it); returns how many."""
        count = 0
        for i, node in enumerate(self.nodes):
            if i and node.poll() is not None:
                self.nodes[i] = self.add_node()
                self.nodes.pop()
                count += 1
        return count

    def log(self, name: str) -> str:
        """The tail of a node's ``ray start`` output (for failure messages)."""
        path = self.temp_dir / f"{name}.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def kill(self, node: subprocess.Popen) -> None:
        """Kill a node at once (raylet, its workers and agents): a machine lost mid-run."""
        for pid in node_processes(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.wait(timeout=30)

    def stop(self) -> None:
        """Stop every node this cluster started, and any straggler of its temp dir."""
        for node in reversed(self.nodes):
            _killpg(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3  # then killed: nothing of theirs is kept
        for node in self.nodes:
            try:
                node.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)
        # Workers Ray started in a session of their own still name our temp dir.
        for pid in _pids_naming(str(self.temp_dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _pids_naming(text: str) -> list[int]:
    """Processes of this user whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_nodes(count: int, timeout_s: float = 120, cluster: RayCluster | None = None) -> None:
    """Wait until the connected driver sees ``count`` live nodes (restarting, once, the
    ``cluster``'s worker nodes that exited)."""
    import ray

    deadline = time.monotonic() + timeout_s
    restarted = False
    while time.monotonic() < deadline:
        if sum(1 for n in ray.nodes() if n["Alive"]) >= count:
            return
        if cluster is not None and not restarted:
            restarted = cluster.restart_exited() > 0
        time.sleep(0.2)
    raise TimeoutError(f"fewer than {count} Ray nodes after {timeout_s} s")



def _procs() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, title) of every process we can read."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'
            fields = stat.rpartition(")")[2].split()
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            found[int(entry.name)] = (int(fields[1]), int(fields[2]), title)
        except (OSError, ValueError, IndexError):
            continue
    return found


def node_processes(node: subprocess.Popen) -> dict[int, str]:
    """pid -> title of a node's processes: its process group, and the Ray workers its raylet
    started (in sessions of their own) with their children."""
    procs = _procs()
    mine = {pid for pid, (_, pgid, _) in procs.items() if pgid == node.pid}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in procs.items() if ppid in mine} - mine
        mine |= more
        grew = bool(more)
    return {pid: procs[pid][2] for pid in mine}


def task_titles(node: subprocess.Popen) -> list[str]:
    """Titles of a node's processes: a Ray worker running a task is titled
    ``ray::<function name>`` while it runs."""
    return sorted(node_processes(node).values())


@contextmanager
def connected_cluster() -> Iterator[RayCluster]:
    """A head and one worker node, this process a driver connected to them; everything
    stopped (and the driver disconnected) on exit."""
    import ray

    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update({k: ray_env()[k] for k in saved})
    nodes = RayCluster()
    try:
        nodes.start_head()
        nodes.add_node()
        ray.init(address=nodes.address, log_to_driver=False)
        wait_nodes(2, cluster=nodes)
        yield nodes
    finally:
        ray.shutdown()
        nodes.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
