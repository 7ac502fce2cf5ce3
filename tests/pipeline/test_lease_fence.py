"""Issue 33 item 6: a job that stalls past its lease on an object store, and loses it to another
job, publishes nothing more (no derived partition, no state, no analytics table) and the job
that took over keeps its outputs. Against a real S3 endpoint (moto), with the stall simulated
as a real one looks: the renewal thread stops too, the lease expires, another holder takes it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetlens.pipeline import joblock, lease, runner
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, LeaseLost, fence, write_parquet_atomic
from tests.pipeline.rawdata import T0, spans_frame, vllm_span, write_raw
from tests.s3 import S3Server, s3_server  # noqa: F401 - the fixture `s3`

TTL_S = 2.0
REPO = Path(__file__).resolve().parents[2]


def _url(server: S3Server) -> str:
    return f"s3://{server.bucket()}/fleet"


def _snapshot(dd: DataDir) -> dict[str, bytes]:
    """Every object of derived/ and state/ but the lease, by key."""
    return {str(p.relative_to(dd.root)): p.read_bytes()
            for folder in (dd.root / "derived", dd.state) for p in folder.files()
            if not p.name.endswith(".lock")}


def _spans(first: int, n: int) -> Any:
    return spans_frame([vllm_span(i, start_ns=T0 + i * 1_000_000_000, host="h1")
                        for i in range(first, first + n)])


def _stall(dd: DataDir) -> lease.Lease:
    """Stall this process's job as a paused process would: renewals stop, the lease expires."""
    held = joblock._HELD[joblock.lock_path(dd)].lease
    held._stop.set()
    held._thread.join()
    time.sleep(TTL_S + 0.5)
    return held


def _stopped(job: Callable[[], Any]) -> BaseException | None:
    """Run ``job``; the error it stopped with (checked after the data it left)."""
    try:
        job()
    except Exception as exc:  # noqa: BLE001 - the test asserts which
        return exc
    return None


def _fleetlens(args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    out = subprocess.run([sys.executable, "-m", "fleetlens", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_pipeline_that_lost_its_lease_publishes_nothing(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lease.ENV_LEASE_S, str(TTL_S))
    dd = DataDir(_url(s3))
    write_raw(dd, t.SPANS, _spans(0, 5), seq=1)
    after_second: dict[str, bytes] = {}
    discover = runner.discover

    def stall_after_discovery(*args: Any, **kwargs: Any) -> Any:
        found = discover(*args, **kwargs)  # this run saw 5 spans
        write_raw(dd, t.SPANS, _spans(5, 7), seq=2)  # arrives while it stalls
        stalled = _stall(dd)
        _fleetlens(["pipeline", "--data-dir", str(dd.root)])  # the job that took over
        after_second.update(_snapshot(dd))
        current = lease.read(joblock.lock_path(dd))
        assert current is None or current[0]["token"] != stalled.token
        return found

    monkeypatch.setattr(runner, "discover", stall_after_discovery)
    error = _stopped(lambda: runner.Pipeline(dd, PipelineConfig()).run_once())
    assert any(k.startswith("derived/requests/") for k in after_second)
    assert _snapshot(dd) == after_second  # the second run's 12 requests stand, untouched
    assert isinstance(error, LeaseLost), error
    assert re.match(r"lease lost to \d+ pipeline on .+: this run stops without publishing",
                    str(error)), error
    assert not fence._CHECKS  # the stopped job left no guard behind


def test_an_analytics_run_that_lost_its_lease_publishes_nothing(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetlens.analytics import runner as analytics_runner
    from tests.analytics.synthetic_io import write_tables
    from tests.analytics.webhook_receiver import fleet

    monkeypatch.setenv(lease.ENV_LEASE_S, str(TTL_S))
    dd = DataDir(_url(s3))
    write_tables(fleet(), dd)
    before: dict[str, bytes] = {}
    analyse = analytics_runner.analyse

    def stall_while_analysing(*args: Any, **kwargs: Any) -> Any:
        result = analyse(*args, **kwargs)
        _stall(dd)
        # Another process takes the lease and publishes its own provenance (a raw PUT: this
        # process's fence guards only its own writes).
        other = lease.acquire(joblock.lock_path(dd), "analytics", None, ttl_s=60)
        path = dd.state / "analytics" / "provenance.json"
        path.bucket.put(path.key, json.dumps({"by": "the other job"}).encode())
        before.update(_snapshot(dd))
        other.release()
        return result

    monkeypatch.setattr(analytics_runner, "analyse", stall_while_analysing)
    error = _stopped(lambda: analytics_runner.run(dd, notify=False))
    assert _snapshot(dd) == before  # no baseline, incident or provenance of the stalled run
    assert isinstance(error, LeaseLost) and "stops without publishing" in str(error), error


def test_a_webhook_run_that_lost_its_delivery_lease_posts_nothing_more(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetlens.analytics import runner as analytics_runner
    from fleetlens.analytics.config import AnalyticsConfig
    from fleetlens.analytics.published import state_dir
    from tests.analytics.synthetic_io import write_tables
    from tests.analytics.webhook_receiver import fleet, serve

    monkeypatch.setenv(lease.ENV_LEASE_S, str(TTL_S))
    dd = DataDir(_url(s3))
    write_tables(fleet(), dd)
    taken: list[lease.Lease] = []
    acquire = lease.acquire

    def recording_acquire(*args: Any, **kwargs: Any) -> lease.Lease:
        taken.append(acquire(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(lease, "acquire", recording_acquire)
    states: list[bytes] = []
    deliveries = state_dir(dd) / "deliveries.json"

    def stall() -> None:  # while the first post is being answered
        held = taken[-1]
        held._stop.set()
        held._thread.join()
        time.sleep(TTL_S + 0.5)
        acquire(held.path, "webhooks", None, ttl_s=60)  # another analyze took it over
        states.append(deliveries.read_bytes())

    with serve(during=stall) as first, serve() as second:
        config = AnalyticsConfig(webhooks=(first.url(), second.url()))
        with pytest.raises(LeaseLost, match=r"lease lost to \d+ webhooks on "):
            analytics_runner.run(dd, config)
        assert len(first.posts()) == 1 and not second.posts()  # nothing after the takeover
    assert deliveries.read_bytes() == states[0]  # its state not written over either


def test_a_released_lease_is_a_conditional_write_that_spares_a_new_holder(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33 item 10: release() read the lease and then DELETEd it; a job that took it over
    between the two had its lease deleted under it."""
    path = joblock.lock_path(DataDir(_url(s3)))
    first = lease.acquire(path, "pipeline", None, ttl_s=60)
    first._stop.set()
    first._thread.join()
    bucket = path.bucket
    get, put = bucket.get, bucket.put
    taken = []

    def take_over() -> None:  # another job's takeover, once, just before our next write
        if not taken:
            _, version = get(path.key)
            body = json.dumps({"holder": "2 compact", "token": "new", "expires_unix":
                               time.time() + 60}).encode()
            taken.append(put(path.key, body, mode={"e_tag": version}))

    def get_then_take_over(key: str) -> Any:
        seen = get(key)
        take_over()
        return seen

    def take_over_then_put(key: str, data: bytes, mode: Any = None) -> Any:
        take_over()
        return put(key, data, mode)

    monkeypatch.setattr(bucket, "get", get_then_take_over)
    monkeypatch.setattr(bucket, "put", take_over_then_put)
    first.release()
    monkeypatch.undo()
    current = lease.read(path)
    assert taken and current is not None and current[0]["token"] == "new"


def test_a_local_job_cannot_lose_its_lock(tmp_path: Path) -> None:
    """A flock is held by the kernel until the process exits: a local job registers no fence
    and publishes as before."""
    dd = DataDir(tmp_path / "data")
    with joblock.exclusive(dd, "pipeline"):
        assert not fence._CHECKS
        write_parquet_atomic(_spans(0, 1), dd.root / "derived" / "x" / "part.parquet")


def test_a_renewal_whose_answer_was_lost_still_holds_the_lease(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A renewal PUT that the store applied but whose answer never came (it timed out at 30 s
    on a loaded machine) left the lease naming us at a version we did not know; the next
    renewal conflicted with our own write and the job stopped as if another had taken over
    ('lost the job lease to <our own pid> analytics', test_object_store_e2e at load 18)."""
    path = joblock.lock_path(DataDir(_url(s3)))
    held = lease.acquire(path, "analytics", None, ttl_s=60)
    held._stop.set()
    held._thread.join()
    bucket = path.bucket
    put = bucket.put

    def applied_then_lost(key: str, data: bytes, mode: Any = None) -> Any:
        put(key, data, mode)
        raise OSError("error sending request: timed out after 30 s")

    monkeypatch.setattr(bucket, "put", applied_then_lost)
    with pytest.raises(OSError):
        held._renew_once()
    monkeypatch.undo()
    held._valid_until = 0.0  # stale: the next check renews
    held.check()  # old code: LeaseLost("lease lost to <this pid> analytics ...")
    assert not held.lost.is_set()
    current = lease.read(path)
    assert current is not None and current[0]["token"] == held.token
    assert current[1] == held.version
    held.release()
