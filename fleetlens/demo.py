"""``fleetlens demo``: the whole product on a simulated fleet, in one command.

Starts the collector, simulates a fleet with injected incidents into it, runs the pipeline
and analytics, then serves the dashboard and prints its URL. Every process it starts is a
child it stops by PID (Ctrl-C, SIGTERM, or an error). A second run reuses the finished data
directory (``--fresh`` rebuilds it); a directory it did not create is never deleted.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import click

from fleetlens.demo_summary import dashboard_lines, first_incident, summary_lines

MARKER = ".fleetlens-demo"
DONE = "demo-complete.json"
SCENARIO_TEMPLATE = Path(__file__).with_name("demo.toml")
#: component -> module that must exist for its step to run.
COMPONENTS = {
    "collector": "fleetlens.collector.cli", "simulator": "fleetlens.simulator.cli",
    "pipeline": "fleetlens.pipeline.cli", "analytics": "fleetlens.analytics.runner",
    "dashboard": "fleetlens.dashboard.cli",
}


class Children:
    """The processes the demo started, stopped by PID in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str], **kwargs) -> subprocess.Popen:  # noqa: ANN003
        # A new session: Ctrl-C reaches only the demo, which then stops children in order.
        proc = subprocess.Popen([sys.executable, "-m", "fleetlens", *args],
                                start_new_session=True, **kwargs)
        self.procs.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen, timeout_s: float = 20) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def stop_all(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                click.echo(f"stopping {name} (pid {proc.pid})", err=True)
            self.stop(proc)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, what: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"{what} exited with status {proc.returncode}")
        if check():
            return
        time.sleep(0.3)
    raise click.ClickException(f"{what} not ready after {timeout_s:.0f} s")


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def prepare(root: Path, fresh: bool) -> bool:
    """Make ``root`` ready; return True when a finished demo there can be reused."""
    if root.exists() and any(root.iterdir()):
        if not (root / MARKER).exists():
            raise click.ClickException(
                f"{root} exists and was not made by `fleetlens demo`; pass another --data-dir")
        if (root / DONE).exists() and not fresh:
            click.echo(f"reusing the demo data in {root} (pass --fresh to rebuild it)")
            return True
        click.echo(f"cleaning {root} (an earlier demo{'' if fresh else ' did not finish'})")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("made by fleetlens demo; safe to delete\n")
    return False


def write_scenario(root: Path, minutes: int) -> Path:
    """The demo scenario, ending (with its drain) about now."""
    duration = minutes * 60
    start = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=duration + 60)
    text = SCENARIO_TEMPLATE.read_text().format(
        minutes=minutes, start=start.strftime("%Y-%m-%dT%H:%M:%SZ"), duration_s=duration,
        t1=int(duration * 0.52), t2=int(duration * 0.64), t3=int(duration * 0.76),
        t4=int(duration * 0.88))
    path = root / "demo-scenario.toml"
    path.write_text(text)
    return path


def build(root: Path, minutes: int, speed: float | None, missing: list[str],
          children: Children) -> None:
    """Collector + simulator, then pipeline, then analytics: whatever exists of them."""
    if "collector" in missing or "simulator" in missing:
        click.echo("skipping the simulated fleet: "
                   f"{' and '.join(m for m in missing if m in ('collector', 'simulator'))}"
                   " not available in this build")
    else:
        grpc, http = free_port(), free_port()
        click.echo(f"[1/4] collector on 127.0.0.1:{grpc} (OTLP/gRPC), data in {root}")
        collector = children.start("collector", [
            "collector", "--data-dir", str(root), "--grpc-address", f"127.0.0.1:{grpc}",
            "--http-address", f"127.0.0.1:{http}", "--workers", "1"])
        wait_for(lambda: _port_open(grpc), "collector", collector)
        click.echo(f"[2/4] simulating {minutes} minutes of a 16-GPU fleet with 4 incidents")
        args = ["simulate", "--scenario", str(write_scenario(root, minutes)), "--endpoint",
                f"127.0.0.1:{grpc}", "--ground-truth", str(root / "ground-truth.json")]
        if speed:
            args += ["--speed", str(speed)]
        sim = children.start("simulator", args)
        if sim.wait() != 0:
            raise click.ClickException(f"simulator failed with status {sim.returncode}")
        click.echo("      draining the collector")
        children.stop(collector, timeout_s=60)
    if "pipeline" in missing:
        click.echo("skipping the pipeline: not available in this build")
    else:
        click.echo("[3/4] pipeline: raw telemetry to requests, windows and energy")
        # The fleet was simulated faster than real time, so its spans arrive long after they
        # end: --replay, or the pipeline would warn about every host's export delay.
        pipe = children.start("pipeline", ["pipeline", "--data-dir", str(root), "--progress",
                                           "--replay"])
        if pipe.wait() != 0:
            raise click.ClickException(f"pipeline failed with status {pipe.returncode}")
    if "analytics" in missing:
        click.echo("skipping analytics: not available in this build")
    else:
        click.echo("[4/4] analytics: baselines, incidents and causes")
        from fleetlens.analytics.runner import run

        run(str(root))
    (root / DONE).write_text(json.dumps({"minutes": minutes, "skipped": missing}) + "\n")


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default="./fleetlens-demo",
              show_default=True, help="Where the demo keeps its data.")
@click.option("--fresh", is_flag=True, help="Rebuild the data even if a finished demo exists.")
@click.option("--minutes", type=click.IntRange(40, 24 * 60), default=90, show_default=True,
              help="Simulated minutes of fleet history.")
@click.option("--speed", type=float, default=None,
              help="Simulated seconds per wall second [default: as fast as possible].")
@click.option("--port", type=click.IntRange(0, 65535), default=8501, show_default=True,
              help="Dashboard port on 127.0.0.1 (a free one if taken or 0).")
@click.option("--no-dashboard", is_flag=True, help="Build the data, then exit.")
def demo(data_dir: str, fresh: bool, minutes: int, speed: float | None, port: int,
         no_dashboard: bool) -> None:
    """Run fleetlens end to end on a simulated fleet and open the dashboard.

    Starts the collector, simulates a 16-GPU vLLM fleet with injected incidents (KV-cache
    pressure, a traffic surge, a throttling GPU), runs the pipeline and analytics, then
    serves the dashboard on 127.0.0.1 and prints its URL. Ctrl-C stops everything it started.
    """
    root = Path(data_dir).expanduser().resolve()
    missing = [name for name, module in COMPONENTS.items()
               if importlib.util.find_spec(module) is None]
    children = Children()

    def _stop(signum, frame) -> None:  # noqa: ANN001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        if not prepare(root, fresh):
            build(root, minutes, speed, missing, children)
        if "analytics" not in missing:
            # From the stored tables, after a build or a reuse alike: a rerun says the same.
            click.echo("\n".join(["", *summary_lines(root, data_dir)]))
        if no_dashboard:
            click.echo(f"  fleetlens dashboard --data-dir {shlex.quote(data_dir)}")
            click.echo(f"demo data ready in {root}")
            return
        if "dashboard" in missing:
            click.echo("skipping the dashboard: not available in this build")
            return
        if port == 0 or _port_open(port):
            port = free_port()
        dash = children.start("dashboard", ["dashboard", "--data-dir", str(root),
                                            "--port", str(port)])
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(url), "dashboard", dash, timeout_s=90)
        click.echo(f"\nfleetlens dashboard: {url}   (pid {dash.pid}; Ctrl-C stops the demo)")
        for line in dashboard_lines(url, None if "analytics" in missing
                                    else first_incident(root)):
            click.echo(line)
        while dash.poll() is None:
            time.sleep(0.5)
        raise click.ClickException(f"dashboard exited with status {dash.returncode}")
    except KeyboardInterrupt:
        click.echo("\nstopping the demo", err=True)
    finally:
        children.stop_all()
