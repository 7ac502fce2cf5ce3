"""Collectors publishing to S3-compatible object storage (moto's server on 127.0.0.1), end to
end: two replicas sharing nothing but the bucket, and collector -> bucket -> pipeline ->
analytics -> ``fleetlens sql`` and the dashboard's queries, equal to the same raw data in a
local directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import polars as pl
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc

from fleetlens.collector.testing import free_port, vllm_trace_request, wait_for_port
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect, parquet_files, scan
from tests.s3 import S3Server, moto_server, s3_server  # noqa: F401 - the fixture `s3`

pytestmark = pytest.mark.e2e
NS = 1_000_000_000


def _url(server: S3Server, prefix: str = "fleet") -> str:
    return f"s3://{server.bucket()}/{prefix}"


def _fleetlens(args: list[str], env: dict[str, str], timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, "-m", "fleetlens", *args], capture_output=True,
                         text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"fleetlens {' '.join(args)}:\n{out.stderr[-4000:]}"
    return out.stdout


def _collector(url: str, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    grpc = f"127.0.0.1:{free_port()}"
    config = log.with_suffix(".toml")
    config.write_text('[collector]\nself_metrics_address = ""\n')  # no fixed port to share
    with open(log, "ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "collector", "--data-dir", url,
             "--config", str(config), "--grpc-address", grpc,
             "--http-address", f"127.0.0.1:{free_port()}", "--workers", "1"],
            stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for_port(grpc, 60, process)
    except BaseException:
        process.kill()
        sys.stderr.write(log.read_text()[-3000:])
        raise
    return process, grpc


def _download(url: str, local: Path) -> int:
    """Copy every object under ``url`` into ``local`` byte for byte; returns how many."""
    root = DataDir(url).root
    count = 0
    for obj in root.files():
        target = local / str(obj.relative_to(root))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(obj.read_bytes())
        count += 1
    return count


def _table(dd: DataDir, table: str) -> pl.DataFrame:
    con = connect(dd, tables=[table])
    frame = con.sql(f'select * from "{table}"').pl()
    return frame.sort(frame.columns, nulls_last=True)


def test_collector_to_sql_and_dashboard_on_s3_equals_a_local_directory(
        s3: S3Server, tmp_path: Path) -> None:
    from fleetlens.dashboard import queries
    from fleetlens.simulator import parse_scenario, run
    from tests.simulator.test_simulate import small

    url = _url(s3)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    env = {**base, **s3.env, "FLEETLENS_WAL_DIR": str(tmp_path / "wal")}
    process, grpc = _collector(url, env, tmp_path / "collector.log")
    try:
        start_ns = (time.time_ns() // NS - 3600) * NS
        result = run(parse_scenario(small(duration=60.0)), grpc, start_ns=start_ns)
    finally:
        process.terminate()
        assert process.wait(60) == 0, (tmp_path / "collector.log").read_text()[-3000:]
    assert result.exported.spans_failed == result.exported.spans_rejected == 0
    remote = DataDir(url)
    raw = scan(remote, t.SPANS).collect().unique([c.TRACE_ID, c.SPAN_ID])
    assert raw.height == result.spans > 0
    assert not list((tmp_path / "wal").rglob("*.wal"))  # all published, WAL emptied

    # The same raw bytes in a local directory: every later step must give the same rows.
    local = tmp_path / "local"
    assert _download(url + "/raw", local / "raw") > 0
    for root in (url, str(local)):
        summary = json.loads(_fleetlens(["pipeline", "--data-dir", root, "--json"],
                                        env).strip().splitlines()[-1])
        assert summary["rows_written"][t.REQUESTS] > 0
        _fleetlens(["analyze", "--data-dir", root], env)
    here = DataDir(local)
    for table in t.TABLES:
        assert _table(remote, table).equals(_table(here, table)), table
    assert _table(remote, t.WINDOWS).height > 0 and _table(remote, t.GPU_SAMPLES).height > 0

    query = (f"select {c.SERVICE_NAME}, count(*) n from {t.REQUESTS} group by 1 order by 1")
    answers = [_fleetlens(["sql", "--data-dir", root, "--format", "json", query], env)
               for root in (url, str(local))]
    assert answers[0] == answers[1] and json.loads(answers[0])

    # The dashboard's data access: its queries over either directory give the same frames.
    con_remote, con_local = connect(remote), connect(here)
    assert queries.extent(con_remote) == queries.extent(con_local) != (None, None)
    assert queries.options(con_remote) == queries.options(con_local)


def test_two_collector_replicas_share_nothing_but_the_bucket(s3: S3Server,
                                                             tmp_path: Path) -> None:
    url = _url(s3)
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    replicas = []
    try:
        for n in (1, 2):  # each with its own local WAL and writer id
            env = {**base, **s3.env, "FLEETLENS_WAL_DIR": str(tmp_path / f"wal{n}")}
            replicas.append(_collector(url, env, tmp_path / f"collector{n}.log"))
        start_ns = (time.time_ns() // NS - 600) * NS
        sent = 0
        for i in range(8):  # round robin, as a load balancer in front of them would
            _, address = replicas[i % 2]
            with grpc.insecure_channel(address) as channel:
                reply = svc.TraceServiceStub(channel).Export(
                    vllm_trace_request(50, seed=i, start_ns=start_ns + i * NS), timeout=30)
            assert not reply.partial_success.rejected_spans
            sent += 50
    finally:
        for process, _ in replicas:
            process.terminate()
        codes = [process.wait(60) for process, _ in replicas]
    assert codes == [0, 0]
    segments = list(parquet_files(DataDir(url).raw("spans")))
    writers = {p.name.rsplit("-", 1)[0] for p in segments}
    assert len(writers) == 2  # both replicas published, under their own names
    spans = scan(DataDir(url), t.SPANS).collect()
    assert spans.unique([c.TRACE_ID, c.SPAN_ID]).height == sent
    for n in (1, 2):
        assert not list((tmp_path / f"wal{n}").rglob("*.wal"))  # everything published


def test_acknowledged_spans_survive_an_object_store_outage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store goes away while the collector acknowledges (its WAL is local); publishing
    fails and is retried, and once the store is back every acknowledged span is in it."""
    from fleetlens.collector.testing import trace_request, vllm_span

    with moto_server(tmp_path) as first:
        port = int(first.endpoint.rpartition(":")[2])
        name = first.bucket()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEETLENS_", "AWS_"))},
               **first.env, "FLEETLENS_WAL_DIR": str(tmp_path / "wal")}
        process, address = _collector(f"s3://{name}/fleet", env, tmp_path / "collector.log")
    # the server is gone (SIGTERM by PID): the collector still acknowledges
    start_ns = (time.time_ns() // NS - 600) * NS
    import random

    rng = random.Random(5)
    request = trace_request([vllm_span(rng, start_ns=start_ns + i * NS) for i in range(200)])
    try:
        with grpc.insecure_channel(address) as channel:
            reply = svc.TraceServiceStub(channel).Export(request, timeout=30)
        assert not reply.partial_success.rejected_spans
        # Wait for a publish to fail (a flush every flush_interval_s; a fixed sleep was too
        # short on a loaded machine, and the store came back before anything had failed).
        log_path, deadline = tmp_path / "collector.log", time.monotonic() + 90
        while not any(text in log_path.read_text() for text in
                      ("publishing Parquet failed (will retry)", "flush failed")):
            assert time.monotonic() < deadline, "no publish failed while the store was down"
            time.sleep(0.2)
        with moto_server(tmp_path, port=port) as second:  # back, empty: recreate the bucket
            second.bucket(name=name)
            for key, value in second.env.items():
                monkeypatch.setenv(key, value)
            remote = DataDir(f"s3://{name}/fleet")
            deadline = time.monotonic() + 120
            while not list(parquet_files(remote.raw("spans"))):
                assert time.monotonic() < deadline, "nothing published after the outage"
                time.sleep(0.5)
            process.terminate()
            assert process.wait(60) == 0
            spans = scan(remote, t.SPANS).collect()
    finally:
        if process.poll() is None:
            process.kill()
    log = (tmp_path / "collector.log").read_text()
    assert "publishing Parquet failed (will retry)" in log or "flush failed" in log, log[-2000:]
    assert spans.unique([c.TRACE_ID, c.SPAN_ID]).height == 200
    assert not list((tmp_path / "wal").rglob("*.wal"))


@pytest.mark.slow
def test_the_ray_runner_on_a_bucket_publishes_the_local_runners_bytes(
        s3: S3Server, tmp_path: Path) -> None:
    """`pipeline --runner ray` on an s3:// data directory: the tasks on the Ray nodes get the
    DataDir pickled (as its URL) and read the bucket with the nodes' own AWS settings."""
    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.runner import OUTPUTS, Pipeline
    from tests.pipeline.fleet import make_fleet, write_batches
    from tests.pipeline.raycluster import connected_cluster, ray_env

    fleet = make_fleet(seed=7, hosts=2, seconds=2 * 3600, rps=0.2, sample_hz=0.5, batches=2)
    local, remote = DataDir(tmp_path / "local"), DataDir(_url(s3))
    write_batches(local, fleet)
    write_batches(remote, fleet)
    Pipeline(local, PipelineConfig()).run_once()
    with connected_cluster() as cluster:  # its nodes inherit this process's AWS_* settings
        ran = subprocess.run(
            [sys.executable, "-m", "fleetlens", "pipeline", "--data-dir", str(remote.root),
             "--runner", "ray", "--ray-address", cluster.address, "--json", "--no-progress"],
            capture_output=True, text=True, timeout=300, env=ray_env())
    assert ran.returncode == 0, ran.stderr[-3000:]

    def outputs(dd: DataDir) -> dict[str, bytes]:
        return {str(p.relative_to(dd.root)): p.read_bytes()
                for table in OUTPUTS for p in parquet_files(dd.derived(table))}

    assert outputs(remote) == outputs(local) and len(outputs(local)) > 10
