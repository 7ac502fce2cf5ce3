"""The real-vLLM timeline leaves the agent time to deliver what it kept during a collector
outage before stopping it (tests/agent/incident_run.py): checked here without a vLLM."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.agent.incident_run import wait_while_undelivered

FAILED = "engine: export to the collector failed; keeping the collections\n"
BACK = "engine: collector reachable again\n"


def test_a_healthy_agent_is_stopped_at_once(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text("fleetlens agent: 0 GPU(s), 1 vLLM target(s)\n" + FAILED + BACK)
    started = time.monotonic()
    wait_while_undelivered(log, limit_s=30.0)
    assert time.monotonic() - started < 10.0  # far below the 30 s it would wait
    wait_while_undelivered(tmp_path / "no-log-yet.log", limit_s=30.0)  # nothing to wait for


def test_an_agent_in_an_outage_is_left_until_the_collector_answers(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text(BACK + FAILED)

    def recover() -> None:
        time.sleep(1.0)
        with open(log, "a") as handle:
            handle.write(BACK)

    thread = threading.Thread(target=recover)
    started = time.monotonic()
    thread.start()
    wait_while_undelivered(log, limit_s=30.0)
    thread.join()
    assert 0.9 < time.monotonic() - started < 20.0


def test_the_wait_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text(FAILED)
    started = time.monotonic()
    wait_while_undelivered(log, limit_s=0.5)
    assert 0.5 <= time.monotonic() - started < 20.0
