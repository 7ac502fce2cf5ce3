"""Issue 17, edge tier: ``fleetlens collector --forward``. Real edge and central collectors on
127.0.0.1 (TLS + bearer token between them), stopped by PID."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from fleetlens.collector.cli import collector, load
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.forward_files import batches
from fleetlens.collector.testing import (
    RunningCollector,
    free_port,
    gauge_request,
    log_request,
    running_collector,
    vllm_trace_request,
)
from fleetlens.collector.wal_files import Record
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.settings import ConfigError, build
from tests.collector.certs import make_pki

pytestmark = [pytest.mark.e2e]
TOKEN = "central-ingest-token"
#: Both sides publish and forward quickly, so the tests wait little.
FAST = {"flush_interval_s": 0.3, "self_metrics_address": ""}


def raw_rows(data: Path, folder: str, columns: list[str]) -> list[tuple]:
    """Every row (of ``columns``) published under ``data/raw/<folder>``, duplicates kept."""
    rows: list[tuple] = []
    for path in sorted((data / "raw" / folder).rglob("*.parquet")):
        if path.name.startswith("."):
            continue  # a temporary file being written
        table = pq.read_table(path, columns=columns).to_pydict()
        rows += list(zip(*(table[name] for name in columns), strict=True))
    return rows


def span_keys(data: Path) -> list[tuple]:
    return raw_rows(data, "spans", [c.TRACE_ID, c.SPAN_ID])


def point_keys(data: Path) -> list[tuple]:
    return raw_rows(data, "metrics", [c.METRIC_NAME, c.ATTRIBUTES, c.TS_NS])


def sent_span_keys(request: Any) -> set[tuple]:
    return {(s.trace_id.hex(), s.span_id.hex())
            for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def central_config(pki: dict[str, Path], **extra: Any) -> dict[str, Any]:
    tls = {"cert_file": str(pki["server_cert"]), "key_file": str(pki["server_key"])}
    return {**FAST, "auth_tokens": [TOKEN], "tls": tls, **extra}


def edge_config(pki: dict[str, Path], central_grpc: str, **forward: Any) -> dict[str, Any]:
    settings = {"address": central_grpc, "ca_file": str(pki["ca"]), "auth_token": TOKEN,
                **forward}
    return {**FAST, "forward": settings}


@contextlib.contextmanager
def central_and_edge(tmp_path: Path, *, central: dict[str, Any] | None = None,
                     forward: dict[str, Any] | None = None,
                     start_central: bool = True) -> Iterator[tuple[Any, RunningCollector]]:
    """A central collector (TLS, token) and an edge forwarding to it; yields (central or its
    port numbers, edge)."""
    pki = make_pki(tmp_path / "pki")
    ports = {"grpc_port": free_port(), "http_port": free_port()}
    config = central_config(pki, **(central or {}))
    edge_settings = edge_config(pki, f"127.0.0.1:{ports['grpc_port']}", **(forward or {}))
    with contextlib.ExitStack() as stack:
        if start_central:
            credentials = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
            col = stack.enter_context(running_collector(
                tmp_path / "central", config=config, channel_credentials=credentials, **ports))
            yield_central: Any = col
        else:
            yield_central = (config, ports, pki)
        edge = stack.enter_context(running_collector(tmp_path / "edge", config=edge_settings))
        yield yield_central, edge


def test_edge_forwards_everything_it_acknowledged_over_tls_with_a_token(tmp_path) -> None:
    spans = [vllm_trace_request(n, seed=n) for n in (1, 7, 30, 2)]
    now = time.time_ns()
    points = gauge_request("gpu_util", [(now - i, float(i), {"gpu": str(i)}) for i in range(9)])
    logs = log_request(["a", "b", "c"])
    expected = set().union(*(sent_span_keys(r) for r in spans))
    with central_and_edge(tmp_path) as (central, edge):
        for request in (*spans, points, logs):
            edge.export(request)
        wait_until(lambda: set(span_keys(central.data_dir)) >= expected
                   and len(point_keys(central.data_dir)) >= 9
                   and len(raw_rows(central.data_dir, "logs", [c.BODY])) >= 3,
                   30, "the central collector to publish what the edge acknowledged")
        assert edge.stop() == 0
        assert "forwarding to 127.0.0.1" in edge.logs()
    assert sorted(span_keys(central.data_dir)) == sorted(expected)  # once each
    assert len(point_keys(central.data_dir)) == 9
    assert sorted(b for (b,) in raw_rows(central.data_dir, "logs", [c.BODY])) == ["a", "b", "c"]
    # the edge wrote no Parquet and left no WAL (everything was forwarded)
    assert not list((edge.data_dir / "raw").rglob("*.parquet"))
    assert not list((edge.data_dir / "wal").rglob("*.wal"))


def test_an_outage_of_the_central_collector_loses_nothing(tmp_path) -> None:
    with central_and_edge(tmp_path, start_central=False) as ((config, ports, pki), edge):
        acked = set()
        for seed in range(5):  # the central collector is down: the edge still acknowledges
            request = vllm_trace_request(20, seed=seed)
            edge.export(request)
            acked |= sent_span_keys(request)
        wait_until(lambda: "cannot forward to" in edge.logs(), 20, "the outage to be logged")
        assert not list((tmp_path / "central").rglob("*.parquet"))
        credentials = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
        with running_collector(tmp_path / "central", config=config,
                               channel_credentials=credentials, **ports) as central:
            wait_until(lambda: set(span_keys(central.data_dir)) >= acked, 60,
                       "the backlog to reach the central collector")
            assert edge.stop() == 0
        assert "forwarding to 127.0.0.1" in edge.logs() and " again after " in edge.logs()
    assert sorted(span_keys(tmp_path / "central")) == sorted(acked)


def test_a_full_edge_wal_refuses_retryably_and_recovers(tmp_path) -> None:
    limit = 150_000
    forward = {"max_pending_bytes": limit}
    with central_and_edge(tmp_path, start_central=False, forward=forward) as (
            (config, ports, pki), edge):
        acked: set = set()
        with pytest.raises(grpc.RpcError) as refused:
            for seed in range(200):
                request = vllm_trace_request(20, seed=seed)
                edge.export(request)
                acked |= sent_span_keys(request)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # retryable
        assert "edge WAL full" in edge.logs()
        on_disk = sum(p.stat().st_size for p in (edge.data_dir / "wal").rglob("*.wal"))
        assert on_disk <= limit + 20_000  # bounded: one request over at most
        credentials = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
        with running_collector(tmp_path / "central", config=config,
                               channel_credentials=credentials, **ports) as central:
            wait_until(lambda: set(span_keys(central.data_dir)) >= acked, 60, "the backlog")
            later = vllm_trace_request(5, seed=999)
            wait_until(lambda: _accepted(edge, later), 30, "the edge to accept again")
            acked |= sent_span_keys(later)
            wait_until(lambda: set(span_keys(central.data_dir)) >= acked, 30, "the new spans")
            assert "accepting Exports" in edge.logs()
            assert edge.stop() == 0


def _accepted(edge: RunningCollector, request: Any) -> bool:
    try:
        edge.export(request)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        return False
    return True


def test_a_wrong_token_is_retried_never_dropped_and_a_restart_forwards_the_backlog(
        tmp_path) -> None:
    with central_and_edge(tmp_path, forward={"auth_token": "wrong"}) as (central, edge):
        request = vllm_trace_request(12, seed=5)
        edge.export(request)
        wait_until(lambda: "UNAUTHENTICATED" in edge.logs(), 20, "the refusal to be logged")
        assert "check forward.auth_token" in edge.logs()
        edge.stop()  # SIGTERM: what was not forwarded stays in the WAL
        assert list((edge.data_dir / "wal").rglob("*.wal"))
        assert not span_keys(central.data_dir)
        fixed = edge_config(make_pki(tmp_path / "unused"), central.grpc_address)
        fixed["forward"]["ca_file"] = str(tmp_path / "pki" / "ca.crt")
        with running_collector(edge.data_dir, config=fixed) as restarted:
            wait_until(lambda: set(span_keys(central.data_dir)) == sent_span_keys(request),
                       30, "the backlog left by the first edge process")
            assert "forwarding the WAL" in restarted.logs()
            assert restarted.stop() == 0
        assert not list((edge.data_dir / "wal").rglob("*.wal"))


def test_a_request_the_central_collector_refuses_for_good_is_kept_apart(tmp_path) -> None:
    # The central collector takes 60 kB at most; the edge took a 300-span request (larger).
    with central_and_edge(tmp_path, central={"max_request_bytes": 60_000}) as (central, edge):
        small = [vllm_trace_request(10, seed=s) for s in range(6)]  # merged: over 60 kB
        big = vllm_trace_request(300, seed=77)
        assert big.ByteSize() > 60_000 > sum(r.ByteSize() for r in small[:2])
        for request in (small[0], small[1], big, *small[2:]):
            edge.export(request)
        expected = set().union(*(sent_span_keys(r) for r in small))
        wait_until(lambda: set(span_keys(central.data_dir)) >= expected, 30, "the small ones")
        wait_until(lambda: list((edge.data_dir / "wal" / ".quarantine").glob("forward-*")),
                   30, "the refused request to be kept")
        assert edge.stop() == 0
        assert "refused record" in edge.logs() and "for good" in edge.logs()
    assert not set(span_keys(central.data_dir)) & sent_span_keys(big)


def test_batches_merge_one_signal_within_the_byte_limit() -> None:
    records = [Record(1, 0, b"x" * 10), Record(1, 0, b"x" * 10), Record(1, 0, b"x" * 50),
               Record(2, 0, b"y"), Record(2, 0, b"y" * 100), Record(1, 0, b"z")]
    assert list(batches(records, 0, 30)) == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
    assert list(batches(records, 1, 1000)) == [(1, 3), (3, 5), (5, 6)]
    assert list(batches(records, 6, 1000)) == []


def test_merged_export_requests_parse_as_one_request() -> None:
    first, second = vllm_trace_request(3, seed=1), vllm_trace_request(4, seed=2)
    merged = type(first).FromString(first.SerializeToString() + second.SerializeToString())
    assert sent_span_keys(merged) == sent_span_keys(first) | sent_span_keys(second)


@pytest.mark.parametrize(("forward", "match"), [
    ({"address": "central"}, "forward.address"),
    ({"address": "h:1", "cert_file": "c.pem"}, "forward.cert_file"),
    ({"address": "h:1", "insecure": True, "ca_file": "ca.pem"}, "forward.insecure"),
    ({"address": "h:1", "auth_token": " "}, "forward.auth_token"),
    ({"address": "h:1", "max_pending_bytes": 0}, "forward.max_pending_bytes"),
])
def test_bad_forward_settings_are_config_errors(forward: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build(CollectorConfig, {"forward": forward}, "collector")


def test_the_edge_daemonset_example_parses_with_the_real_cli(tmp_path, monkeypatch) -> None:
    """deploy/k8s/edge/: the args parse with the real command, the env configures forwarding."""
    path = Path(__file__).parents[2] / "deploy" / "k8s" / "edge" / "edge-collector-daemonset.yaml"
    (doc,) = yaml.safe_load_all(path.read_text())
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "collector"
    params = collector.make_context("collector", list(args[1:])).params
    assert params["forward"] == "fleetlens-collector.fleetlens.svc:4317"
    assert params["grpc_address"].startswith("127.0.0.1:")  # node-local only
    monkeypatch.chdir(tmp_path)  # no ./fleetlens.toml
    for name in [k for k in os.environ if k.startswith("FLEETLENS_")]:
        monkeypatch.delenv(name)
    for entry in container["env"]:
        monkeypatch.setenv(entry["name"], entry.get("value", "token-from-secret"))
    config, _ = load(None, {"forward": {"address": params["forward"],
                                        "ca_file": params["forward_ca"]}})
    assert config.forward.enabled and config.forward.auth_token == "token-from-secret"
    assert config.forward.max_pending_bytes == 8 * 1024**3


@pytest.mark.parametrize(("args", "message"), [
    (["--forward", "central"], "forward.address"),
    (["--forward", "h:1", "--forward-insecure", "--forward-ca", "ca.pem"], "forward.insecure"),
    (["--forward", "h:1", "--forward-cert", "c.pem"], "forward.cert_file"),
    (["--self-metrics-address", "8888"], "self_metrics_address"),
])
def test_forward_options_reach_the_config_checks(tmp_path, monkeypatch, args: list[str],
                                                 message: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(collector, ["--data-dir", str(tmp_path / "d"), *args])
    assert result.exit_code != 0
    assert "invalid configuration" in result.output and message in result.output


def test_a_restarted_edge_counts_the_backlog_it_adopted(tmp_path) -> None:
    """The WAL a killed edge left counts against the bound (and shows on the self-metrics
    port) as soon as the next edge process adopts it, before it accepts anything."""
    pki = make_pki(tmp_path / "pki")
    metrics = f"127.0.0.1:{free_port()}"
    config = edge_config(pki, f"127.0.0.1:{free_port()}")  # nothing listens there
    config["self_metrics_address"] = metrics
    name = "fleetlens_collector_forward_pending_bytes"
    with running_collector(tmp_path / "edge", config=config, workers=2) as edge:
        for seed in range(4):
            edge.export(vllm_trace_request(30, seed=seed))
        edge.kill()
    left = sum(p.stat().st_size for p in (tmp_path / "edge" / "wal").rglob("*.wal"))
    assert left > 4 * 30 * 500
    with running_collector(tmp_path / "edge", config=config, workers=2) as edge:
        wait_until(lambda: _scrape_value(metrics, name) == left, 20, "the adopted backlog")
        assert "forwarding the WAL" in edge.logs()


def _scrape_value(address: str, name: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def test_an_unreadable_forward_tls_file_stops_the_edge_with_one_line(tmp_path) -> None:
    missing = tmp_path / "no-such-ca.crt"
    result = CliRunner().invoke(collector, [
        "--data-dir", str(tmp_path / "d"), "--grpc-address", f"127.0.0.1:{free_port()}",
        "--http-address", f"127.0.0.1:{free_port()}", "--self-metrics-address", "",
        "--forward", "127.0.0.1:1", "--forward-ca", str(missing)])
    assert result.exit_code != 0
    assert f"cannot read forward.ca_file {missing}: No such file or directory" in result.output


def test_forwarding_without_compression_works_too(tmp_path) -> None:
    request = vllm_trace_request(8, seed=8)
    with central_and_edge(tmp_path, forward={"compression": "none"}) as (central, edge):
        edge.export(request)
        wait_until(lambda: set(span_keys(central.data_dir)) == sent_span_keys(request), 30,
                   "the forwarded spans")


def test_a_central_collector_that_never_answers_does_not_hold_up_a_stopping_edge(
        tmp_path) -> None:
    """A central side that takes the call and never answers (hung): SIGTERM cancels the call
    in flight and the edge stops within its grace, long before the 120 s call deadline,
    keeping what it could not forward."""
    pki = make_pki(tmp_path / "pki")
    release = threading.Event()

    def hang(request: bytes, context: grpc.ServicerContext) -> bytes:
        release.wait(180)
        return b""

    class Hung(grpc.GenericRpcHandler):
        def service(self, details: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(hang)

    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[Hung()])
    credentials = grpc.ssl_server_credentials(
        [(pki["server_key"].read_bytes(), pki["server_cert"].read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        config = edge_config(pki, f"127.0.0.1:{port}", timeout_s=120.0)
        with running_collector(tmp_path / "edge", config=config) as edge:
            edge.export(vllm_trace_request(10, seed=3))
            time.sleep(1.0)  # the forwarding call hangs by now
            assert edge.stop(timeout=60) == 0  # not SIGKILLed after 60 s
            assert "not yet forwarded" in edge.logs()
    finally:
        release.set()
        server.stop(0)
    assert list((tmp_path / "edge" / "wal").rglob("*.wal"))  # kept for the next start


def test_plaintext_forwarding_off_loopback_is_warned_about(caplog) -> None:
    """Channels connect lazily: nothing here leaves the machine."""
    from fleetlens.collector.config import ForwardConfig
    from fleetlens.collector.forward_client import channel_for

    for address, warned in (("192.0.2.1:4317", True), ("127.0.0.1:4317", False)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="fleetlens.collector"):
            channel_for(ForwardConfig(address=address, insecure=True)).close()
        assert ("in plaintext" in caplog.text) is warned, address
