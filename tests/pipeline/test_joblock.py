"""The data directory's job lock, and readers that survive files deleted under them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from fleetlens.pipeline.joblock import exclusive, holder
from fleetlens.pipeline.storage import READ_ATTEMPTS, DataDir, retry_vanished

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}


def _wait_for_line(stream, needle: str, timeout: float) -> str:
    """Read ``stream`` (a pipe) until a line contains ``needle``."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} not printed; got {''.join(seen)!r}")


def test_compact_waits_for_the_job_holding_the_lock(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    with exclusive(dd, "pipeline"):
        assert holder(dd) == f"{os.getpid()} pipeline"
        compact = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "compact", "--data-dir", str(dd.root)],
            cwd=REPO, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            line = _wait_for_line(compact.stderr, "waiting for", timeout=60)
            assert f"{os.getpid()} pipeline" in line and str(dd.root) in line
            time.sleep(0.5)
            assert compact.poll() is None, "compact ran while the lock was held"
        except BaseException:
            compact.kill()
            compact.communicate()
            raise
    out, err = compact.communicate(timeout=60)
    assert compact.returncode == 0, err
    assert holder(dd).endswith(" compact")  # it ran, after the release


def test_the_lock_is_reentrant_for_its_thread_and_excludes_other_threads(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    entered = threading.Event()
    waits: list[str] = []

    def other() -> None:
        with exclusive(dd, "analytics", on_wait=waits.append):
            entered.set()

    with exclusive(dd, "pipeline"):
        with exclusive(dd, "analytics"):  # the --follow loop's analysis inside its step
            pass
        thread = threading.Thread(target=other)
        thread.start()
        assert not entered.wait(0.5)
    thread.join(10)
    assert entered.is_set()
    assert waits == []  # a thread of this process waits on the process's own mutex


def test_a_killed_holder_leaves_no_stale_lock(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    code = ("import sys, time; from pipeline.joblock import exclusive; "
            "from pipeline.storage import DataDir\n"
            f"with exclusive(DataDir({str(dd.root)!r}), 'pipeline'):\n"
            "    print('held', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env(),
                             stdout=subprocess.PIPE, text=True)
    try:
        _wait_for_line(child.stdout, "held", timeout=60)
        waits: list[str] = []
        acquired = threading.Event()

        def wait_for_lock() -> None:
            with exclusive(dd, "compact", on_wait=waits.append):
                acquired.set()

        blocked = threading.Thread(target=wait_for_lock, daemon=True)
        blocked.start()
        deadline = time.monotonic() + 10
        while not waits and time.monotonic() < deadline:
            time.sleep(0.02)
        assert waits and f"{child.pid} pipeline" in waits[0]
        assert not acquired.is_set()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert acquired.wait(10), "the lock outlived its SIGKILLed holder"


def test_retry_vanished_retries_only_missing_files() -> None:
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise duckdb.IOException(
                'IO Error: No files found that match the pattern "/d/raw/spans/x.parquet"')
        return 7

    assert retry_vanished(flaky) == 7 and len(calls) == 3

    calls.clear()

    def broken() -> None:
        calls.append(1)
        raise duckdb.BinderException("Referenced column \"nope\" not found")

    with pytest.raises(duckdb.BinderException):
        retry_vanished(broken)
    assert len(calls) == 1

    calls.clear()

    def gone() -> None:
        calls.append(1)
        raise FileNotFoundError("No such file or directory (os error 2): /d/x.parquet")

    with pytest.raises(FileNotFoundError):
        retry_vanished(gone)
    assert len(calls) == READ_ATTEMPTS
