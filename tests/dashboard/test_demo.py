"""``fleetlens demo`` end to end: real processes, incidents found, Ctrl-C stops them all."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import connect, scan

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def fleetlens(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetlens", *args]


def test_demo_builds_data_with_incidents_and_causes(real_demo) -> None:
    con = connect(real_demo)
    counts = {name: con.sql(f"SELECT count(*) FROM {name}").fetchall()[0][0]
              for name in (t.SPANS, t.REQUESTS, t.WINDOWS, t.GPU_SAMPLES, t.ENGINE_SAMPLES,
                           t.BASELINES, t.INCIDENTS, t.CAUSES)}
    assert all(counts.values()), counts
    truth = json.loads((real_demo.root / "ground-truth.json").read_text())["incidents"]
    top = scan(real_demo, t.CAUSES).filter(pl.col(c.RANK) == 1).collect()
    found = set(zip(top[c.CAUSE], top[c.SUBJECT], strict=True))
    hits = [item for item in truth if (item["cause"], item["subject"]) in found]
    # The demo shows incidents with their causes: most injected ones are found and explained.
    assert len(hits) >= 2, (truth, found)


def test_second_run_reuses_and_ctrl_c_stops_every_process(real_demo) -> None:
    proc = subprocess.Popen(fleetlens("demo", "--data-dir", str(real_demo.root), "--port", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    url = pid = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            lines.append(line)
            found = re.search(r"fleetlens dashboard: (http://127\.0\.0\.1:\d+).*pid (\d+)", line)
            if found:
                url, pid = found.group(1), int(found.group(2))
                break
        assert url, "".join(lines)
        assert any("reusing the demo data" in line for line in lines), "".join(lines)
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        proc.wait(timeout=60)
        rest = proc.stdout.read()
        assert f"stopping dashboard (pid {pid})" in rest, rest
        assert not _alive(pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_demo_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    out = subprocess.run(fleetlens("demo", "--data-dir", str(tmp_path), "--no-dashboard"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "was not made by `fleetlens demo`" in out.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
