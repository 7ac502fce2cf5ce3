"""What a GPU host pays for ``fleetlens[agent]``: install size and the agent's memory.

Usage: ``.venv/bin/python bench/agent_footprint.py [--gpus 8] [--seconds 30]``

1. Builds a throwaway venv with ``pip install -c constraints.txt '.[agent]'`` (PyPI or the
   local wheel cache) and prints the size of its site-packages and what it holds, beside the
   size of this (dev, ``[all]``) venv's site-packages as the peer.
2. Starts a real collector on loopback (from this venv), runs the light venv's agent with
   ``--fake-gpus N`` (10 Hz sampling, real OTLP export) for ``--seconds``, and prints the
   agent's resident memory: median and peak of 1 s samples (VmRSS), and VmHWM.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fleetlens.collector.testing import running_collector  # noqa: E402

HEAVY = ("prophet", "streamlit", "plotly", "duckdb", "polars", "pyarrow")


def du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def main() -> None:
    from fleetlens.collector.testing import exit_on_sigterm

    exit_on_sigterm()  # a killed run still stops the collectors it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-footprint-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        started = time.monotonic()
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c",
                        str(REPO / "constraints.txt"), f"{REPO}[agent]"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        light = site_packages(venv)
        names = sorted(p.name.split("-")[0].lower() for p in light.glob("*.dist-info"))
        heavy = [n for n in names if n in HEAVY]
        full_mb = du_mb(site_packages(Path(sys.prefix)))
        print(f"install: fleetlens[agent] {du_mb(light):.0f} MB of site-packages "
              f"({len(names)} distributions, {time.monotonic() - started:.0f} s to install); "
              f"this [all]+dev venv {full_mb:.0f} MB (x{full_mb / du_mb(light):.1f})")
        print(f"  distributions: {' '.join(names)}")
        print(f"  heavy packages present: {heavy or 'none'}")
        with running_collector(Path(tmp) / "data") as col:
            agent = subprocess.Popen(
                [str(venv / "bin" / "fleetlens"), "agent", "--fake-gpus", str(args.gpus),
                 "--collector", col.grpc_address, "--host-name", "bench"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
            rss = []
            try:
                deadline = time.monotonic() + args.seconds
                while time.monotonic() < deadline and agent.poll() is None:
                    time.sleep(1.0)
                    rss.append(status_kb(agent.pid, "VmRSS") / 1024)
                hwm = status_kb(agent.pid, "VmHWM") / 1024
                cpu = sum(int(x) for x in Path(f"/proc/{agent.pid}/stat").read_text()
                          .rsplit(")", 1)[1].split()[11:13]) / 100
            finally:
                agent.terminate()
                agent.wait(timeout=30)
        print(f"agent RSS with {args.gpus} fake GPUs at 10 Hz over {len(rss)} s: median "
              f"{statistics.median(rss):.1f} MiB, peak {max(rss):.1f} MiB, VmHWM {hwm:.1f} MiB; "
              f"CPU {cpu:.2f} s ({100 * cpu / max(len(rss), 1):.1f}% of one core)")


if __name__ == "__main__":
    main()
