"""Issue 14: the collector's own metrics on their own port (no ingest token), otelcol_* names,
process_* over the supervisor and every worker; /metrics on the OTLP/HTTP port keeps its token."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.self_metrics import collector_pids, read_proc
from fleetlens.collector.testing import (
    free_port,
    gauge_request,
    listening_addresses,
    log_request,
    running_collector,
    signal_of,
    trace_request,
    vllm_span,
    vllm_trace_request,
)
from fleetlens.pipeline.schema.settings import ConfigError, build

pytestmark = [pytest.mark.e2e]
TOKEN = "s3cret-ingest-token"
CHANNELS = 6


def _scrape(address: str) -> dict[str, float]:
    """One scrape, parsed with prometheus_client: sample name (+ labels) -> value."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = reply.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return values


def _send(address: str, requests: list) -> None:
    """Send over several channels (connections), so both workers take some."""
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(CHANNELS)]
    try:
        for index, request in enumerate(requests):
            signal = signal_of(request)
            call = channels[index % CHANNELS].unary_unary(
                signal.grpc_method, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=signal.response.FromString)
            call(request, timeout=30, metadata=(("authorization", f"Bearer {TOKEN}"),))
    finally:
        for channel in channels:
            channel.close()


def _cpu_seconds(pids: list[int]) -> float:
    return sum(s.cpu_seconds for s in (read_proc(p) for p in pids) if s is not None)


def test_self_metrics_port_covers_every_worker_and_the_supervisor(tmp_path: Path) -> None:
    metrics_address = f"127.0.0.1:{free_port()}"
    config = {"auth_tokens": [TOKEN], "self_metrics_address": metrics_address}
    rng = random.Random(3)
    span_counts = [rng.randint(1, 40) for _ in range(24)]
    spans = [vllm_trace_request(n, seed=i) for i, n in enumerate(span_counts)]
    # one span with a 3-byte trace id: rejected through the partial success (refused)
    bad = vllm_span(rng)
    bad.trace_id = b"\x01\x02\x03"
    spans.append(trace_request([vllm_span(rng), bad]))
    now = time.time_ns()
    metrics = [gauge_request("gpu_util", [(now - (i * 1000 + j), 1.0, {"gpu": str(j)})
                                          for j in range(5)]) for i in range(10)]
    logs = [log_request([f"line {i}-{j}" for j in range(3)]) for i in range(7)]
    with running_collector(tmp_path / "data", config=config, workers=2) as col:
        _send(col.grpc_address, spans + metrics + logs)
        for seed in (101, 102):  # OTLP/HTTP too: 5 spans each
            body = vllm_trace_request(5, seed=seed).SerializeToString()
            post = urllib.request.Request(
                f"{col.http_url}/v1/traces", data=body, method="POST",
                headers={"Content-Type": "application/x-protobuf",
                         "Authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(post, timeout=30) as reply:
                assert reply.status == 200
        pids = collector_pids(col.pid)
        assert len(pids) == 3, pids  # the supervisor and its two workers
        answers = []
        for _ in range(8):  # fresh connections: each may be accepted by either worker
            before = _cpu_seconds(pids)
            answer = _scrape(metrics_address)
            after = _cpu_seconds(pids)
            answers.append(answer)
            # CPU only grows while all three live: the sum lies between the two readings
            assert before <= answer["process_cpu_seconds_total"] <= after
        grpc_, http = "{receiver=otlp,transport=grpc}", "{receiver=otlp,transport=http}"
        for answer in answers:
            assert answer[f"otelcol_receiver_accepted_spans_total{grpc_}"] == sum(span_counts) + 1
            assert answer[f"otelcol_receiver_accepted_spans_total{http}"] == 10
            assert answer[f"otelcol_receiver_refused_spans_total{grpc_}"] == 1
            assert answer[f"otelcol_receiver_refused_spans_total{http}"] == 0
            assert answer[f"otelcol_receiver_accepted_metric_points_total{grpc_}"] == 50
            assert answer[f"otelcol_receiver_refused_metric_points_total{grpc_}"] == 0
            assert answer[f"otelcol_receiver_accepted_log_records_total{grpc_}"] == 21
            assert answer[f"otelcol_receiver_accepted_log_records_total{http}"] == 0
            assert answer["fleetlens_collector_received_spans_total"] == sum(span_counts) + 11
            assert not any("@" in name for name in answer)  # the split stays in otelcol_*
            assert answer["fleetlens_collector_processes"] == 3
            rss = sum(read_proc(p).rss_bytes for p in pids)  # type: ignore[union-attr]
            assert rss / 2 < answer["process_resident_memory_bytes"] < rss * 2
            assert answer["process_open_fds"] >= 3 * 3  # stdin/out/err of each, at least
            assert answer["process_max_fds"] > 0
            assert answer["process_start_time_seconds"] == \
                read_proc(col.pid).start_time_s  # type: ignore[union-attr]  # the supervisor's
        assert "self-metrics off" not in col.logs()
        # /metrics on the OTLP/HTTP port still requires the token
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{col.http_url}/metrics", timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        request = urllib.request.Request(f"{col.http_url}/metrics",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert b"fleetlens_collector_received_spans_total" in reply.read()


def test_self_metrics_off_with_an_empty_address_and_a_busy_port_does_not_stop_ingest(
        tmp_path: Path) -> None:
    port = free_port()
    with running_collector(tmp_path / "a", config={"self_metrics_address": ""}) as col:
        col.export(vllm_trace_request(3))
        assert not listening_addresses(port)
        assert "self-metrics" not in col.logs()
    busy = f"127.0.0.1:{port}"
    with running_collector(tmp_path / "b", config={"self_metrics_address": busy}) as first, \
            running_collector(tmp_path / "c", config={"self_metrics_address": busy}) as second:
        second.export(vllm_trace_request(3))  # still ingests
        assert f"self-metrics off: cannot listen on {busy}" in second.logs()
        name = "otelcol_receiver_accepted_spans_total{receiver=otlp,transport=grpc}"
        assert _scrape(busy)[name] == 0
        first.export(vllm_trace_request(2))
        assert _scrape(busy)[name] == 2


@pytest.mark.parametrize("address", ["8888", "localhost:", "127.0.0.1:99999"])
def test_a_bad_self_metrics_address_is_a_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match="self_metrics_address"):
        build(CollectorConfig, {"self_metrics_address": address}, "collector")


def test_the_supervisor_binds_without_importing_an_http_server() -> None:
    """The supervisor stays small: http.server (about 4 MiB of RSS) loads in workers only."""
    probe = ("import sys, fleetlens.collector.supervisor as s; "
             "assert s.bind; print('http.server' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "False"
