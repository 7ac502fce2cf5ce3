"""The agent end to end in process: fake GPUs and a real /metrics server in, OTLP metrics out
through the real OpenTelemetry SDK exporter into a gRPC sink (names, units, attributes, batching,
instance -> GPU mapping, token and TLS)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from fleetlens.collector.agent.config import AgentConfig, VllmTarget
from fleetlens.collector.agent.fake_gpu import FakeGpuBackend
from fleetlens.collector.agent.instruments import ENGINE_METRICS, GPU_METRICS
from fleetlens.collector.agent.mapping import listening_pids, with_descendants
from fleetlens.collector.agent.runner import Agent
from fleetlens.pipeline.schema import attributes as a
from tests.agent.otlp_sink import OtlpSink
from tests.agent.test_scraper import metrics_server  # noqa: F401  (fixture)


@pytest.fixture
def sink():
    with OtlpSink() as s:
        yield s


def make_agent(sink: OtlpSink, backend, targets=(), **kw) -> Agent:
    config = AgentConfig(collector=sink.endpoint, host_name="gpu-host-1", vllm=tuple(targets),
                         resource_attributes={"region": "eu-west"}, **kw)
    return Agent(config, backend)


def test_gpu_metrics_names_units_attributes_and_batching(sink: OtlpSink) -> None:
    agent = make_agent(sink, FakeGpuBackend(2))
    for _ in range(10):
        agent.gpu_tick()
    assert agent.gpu_outbox.flush()
    assert len(sink.metric_requests) == 1  # ten collections, one OTLP request
    points = [p for p in sink.points() if p.name in GPU_METRICS]  # health: test_gpu_health
    by_series = defaultdict(list)
    for p in points:
        by_series[(p.name, p.attributes[a.HW_ID])].append(p)
    assert {name for name, _ in by_series} == set(GPU_METRICS)
    assert all(len(series) == 10 for series in by_series.values())
    uuids = {s.uuid: s for s in agent.gpu_state.samples}
    for p in points:
        unit, kind, _, _ = GPU_METRICS[p.name]
        assert p.unit == unit
        assert p.kind == ("gauge" if kind == "gauge" else "sum")
        sample = uuids[p.attributes[a.HW_ID]]
        task = {a.HW_GPU_TASK: a.HW_GPU_TASK_GENERAL} if p.name == a.HW_GPU_UTILIZATION else {}
        assert p.attributes == {a.HW_ID: sample.uuid, a.HW_NAME: sample.name,
                                a.HW_MODEL: sample.name, a.HW_VENDOR: a.HW_VENDOR_NVIDIA,
                                a.HW_TYPE: a.HW_TYPE_GPU, a.GPU_INDEX: sample.index, **task}
        assert p.resource[a.SERVICE_NAME] == "fleetlens-agent"
        assert p.resource[a.HOST_NAME] == "gpu-host-1"
        assert p.resource["region"] == "eu-west"
    energy = sorted((p for p in points if p.name == a.HW_ENERGY), key=lambda p: p.ts_ns)
    assert all(p.is_monotonic for p in energy)
    for uuid in uuids:
        values = [p.value for p in energy if p.attributes[a.HW_ID] == uuid]
        assert values == sorted(values) and values[-1] > values[0]
    power = [p.value for p in points if p.name == a.HW_POWER]
    assert all(70.0 <= w <= 700.0 for w in power)  # watts, not milliwatts
    util = [p.value for p in points if p.name == a.HW_GPU_UTILIZATION]
    assert all(0.0 <= u <= 1.0 for u in util)


def test_gpu_names_and_instruments_follow_semconv(sink: OtlpSink) -> None:
    """semantic-conventions v1.41.0, model/hardware/gpu-metrics.yaml: hw.gpu.memory.utilization
    is the fraction of memory USED; usage and limit are UpDownCounters; hw.model, hw.vendor.
    NVML's memory busy share goes out under a name of its own."""
    agent = make_agent(sink, FakeGpuBackend(1))
    agent.gpu_tick()
    assert agent.gpu_outbox.flush()
    (sample,) = agent.gpu_state.samples
    by_name = {p.name: p for p in sink.points()}
    used = by_name["hw.gpu.memory.utilization"]
    assert used.value == pytest.approx(sample.mem_used_bytes / sample.mem_limit_bytes)
    assert used.value != pytest.approx(sample.util_mem)  # not the controller's busy share
    assert by_name["gpu.memory_controller.utilization"].value == pytest.approx(sample.util_mem)
    for name in ("hw.gpu.memory.usage", "hw.gpu.memory.limit"):
        assert (by_name[name].kind, by_name[name].is_monotonic, by_name[name].unit) == (
            "sum", False, "By")
    assert by_name["hw.gpu.memory.limit"].value == sample.mem_limit_bytes
    assert by_name["hw.energy"].kind == "sum" and by_name["hw.energy"].is_monotonic
    assert by_name["hw.power"].attributes["hw.model"] == sample.name
    assert by_name["hw.power"].attributes["hw.vendor"] == "NVIDIA"
    assert by_name["hw.gpu.utilization"].attributes["hw.gpu.task"] == "general"


def test_missing_fields_and_lost_gpu_are_not_exported(sink: OtlpSink) -> None:
    backend = FakeGpuBackend(2)
    backend.drop_fields(1, "energy_mj")
    agent = make_agent(sink, backend)
    agent.gpu_tick()
    uuid0, uuid1 = (s.uuid for s in agent.gpu_state.samples)
    backend.lose(0)
    agent.gpu_tick()
    assert agent.gpu_outbox.flush()
    energy_gpus = [p.attributes[a.HW_ID] for p in sink.points() if p.name == a.HW_ENERGY]
    assert energy_gpus == [uuid0]  # GPU 1 has no counter; GPU 0 only before it was lost
    power = [p.attributes[a.GPU_INDEX] for p in sink.points() if p.name == a.HW_POWER]
    assert sorted(power) == [0, 1, 1]
    assert uuid1 in {p.attributes[a.HW_ID] for p in sink.points()}


def test_engine_metrics_and_mapping_from_config(sink: OtlpSink, metrics_server) -> None:  # noqa: F811
    server, _ = metrics_server
    port = server.server_address[1]
    target = VllmTarget(url=f"http://127.0.0.1:{port}", instance_id="gpu-host-1/tiny-0",
                        gpus=("1", "GPU-external-uuid"))
    backend = FakeGpuBackend(2)
    agent = make_agent(sink, backend, [target])
    agent.gpu_tick()
    agent.engine_tick_with_mapping()
    assert agent.engine_outbox.flush()
    points = [p for p in sink.points() if p.name in ENGINE_METRICS]
    assert {p.name for p in points} == set(ENGINE_METRICS)
    for p in points:
        unit, kind, _ = ENGINE_METRICS[p.name]
        assert (p.unit, p.kind) == (unit, "sum" if kind == "counter" else "gauge")
        assert p.attributes == {a.ENGINE_INSTANCE: "gpu-host-1/tiny-0",
                                a.ENGINE_MODEL_NAME: "tiny"}
    values = {p.name: p.value for p in points}
    assert values[a.ENGINE_NUM_RUNNING] == 40.0
    assert values[a.ENGINE_GENERATION_TOKENS] == 9308.0
    mapping = [p for p in sink.points() if p.name == a.ENGINE_INSTANCE_GPUS]
    assert sorted(p.attributes[a.HW_ID] for p in mapping) == sorted(
        [backend.read(1).uuid, "GPU-external-uuid"])
    assert all(p.value == 1 and p.attributes[a.ENGINE_INSTANCE] == "gpu-host-1/tiny-0"
               for p in mapping)


def test_finished_requests_and_kv_capacity_are_forwarded(sink: OtlpSink,
                                                         metrics_server) -> None:  # noqa: F811
    server, handler = metrics_server
    handler.body = handler.body.replace(  # two aborted requests: a rate that is not 0
        b'finished_reason="abort",model_name="tiny"} 0.0',
        b'finished_reason="abort",model_name="tiny"} 2.0')
    target = VllmTarget(url=f"http://127.0.0.1:{server.server_address[1]}", instance_id="i-0")
    agent = make_agent(sink, None, [target])
    agent.engine_tick()
    assert agent.engine_outbox.flush()
    finished = {p.attributes["finished_reason"]: p for p in sink.points()
                if p.name == "vllm.requests.finished"}
    assert {r: p.value for r, p in finished.items()} == {
        "stop": 0.0, "length": 27.0, "abort": 2.0, "error": 0.0, "repetition": 0.0}
    assert all(p.kind == "sum" and p.is_monotonic and p.unit == "{request}"
               and p.attributes[a.ENGINE_MODEL_NAME] == "tiny" for p in finished.values())
    (capacity,) = [p for p in sink.points() if p.name == "vllm.kv_cache.capacity"]
    assert (capacity.value, capacity.unit) == (32768 * 128, "{token}")


def test_mapping_from_nvml_pids(sink: OtlpSink, metrics_server) -> None:  # noqa: F811
    server, _ = metrics_server
    port = server.server_address[1]
    assert os.getpid() in listening_pids(port)
    backend = FakeGpuBackend(3)
    backend.set_pids(2, (os.getpid(),))  # the "vLLM" (this process) runs on GPU 2
    backend.set_pids(0, (1,))
    agent = make_agent(sink, backend, [VllmTarget(url=f"http://127.0.0.1:{port}/metrics")])
    agent.gpu_tick()
    agent.refresh_mapping()
    assert agent.engine_state.mapping == {"gpu-host-1/vllm": (backend.read(2).uuid,)}


def test_mapping_waits_for_the_first_gpu_samples(sink: OtlpSink, metrics_server) -> None:  # noqa: F811
    server, _ = metrics_server
    target = VllmTarget(url=f"http://127.0.0.1:{server.server_address[1]}", gpus=("0",))
    backend = FakeGpuBackend(1)
    agent = make_agent(sink, backend, [target])
    agent.engine_tick_with_mapping()  # the engine loop may run before the GPU loop
    assert agent.engine_state.mapping == {}
    agent.gpu_tick()
    agent.engine_tick_with_mapping()  # resolved at once, not after mapping_interval_s
    assert agent.engine_state.mapping == {"gpu-host-1/vllm": (backend.read(0).uuid,)}


def test_descendants_are_found() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in with_descendants({os.getpid()})
        assert os.getpid() not in with_descendants({child.pid})
    finally:
        child.kill()
        child.wait()


def test_token_is_sent_and_a_refused_export_keeps_the_data() -> None:
    with OtlpSink(require_token="s3cret") as sink:
        good = make_agent(sink, FakeGpuBackend(1), auth_token="s3cret")
        good.gpu_tick()
        assert good.gpu_outbox.flush()
        assert sink.metadata[-1]["authorization"] == "Bearer s3cret"
        bad = make_agent(sink, FakeGpuBackend(1), auth_token="wrong")
        bad.gpu_tick()
        bad.gpu_tick()
        assert not bad.gpu_outbox.flush()
        assert len(bad.gpu_outbox._pending) == 2 and bad.gpu_outbox.dropped == 0
        assert len(sink.metric_requests) == 1


def test_outbox_is_bounded_while_the_collector_is_down(sink: OtlpSink) -> None:
    agent = make_agent(sink, FakeGpuBackend(1), max_pending_collections=3)
    for _ in range(5):
        agent.gpu_tick()
    assert agent.gpu_outbox.dropped == 2
    assert agent.gpu_outbox.flush()
    assert len([p for p in sink.points() if p.name == a.HW_POWER]) == 3


def test_a_backlog_goes_out_in_bounded_requests_and_drops_are_logged(
        sink: OtlpSink, caplog) -> None:
    import logging

    from fleetlens.collector.agent.export import MAX_BATCH

    agent = make_agent(sink, FakeGpuBackend(1), max_pending_collections=2 * MAX_BATCH + 10)
    with caplog.at_level(logging.WARNING):
        for _ in range(2 * MAX_BATCH + 15):  # the collector "down" (nothing flushed)
            agent.gpu_tick()
    assert agent.gpu_outbox.dropped == 5
    # Said at the first drop (then at most every 30 s, with the running total).
    (warning,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "1 collections dropped so far" in warning and "max_pending_collections" in warning
    assert agent.gpu_outbox.flush()
    assert len(sink.metric_requests) == 3  # 50 + 50 + 10, not one request of 110
    assert len([p for p in sink.points() if p.name == a.HW_POWER]) == 2 * MAX_BATCH + 10


def test_shutdown_with_the_collector_down_says_what_was_lost_and_exits_1(tmp_path) -> None:
    import signal
    import time

    from fleetlens.collector.testing import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    child = subprocess.Popen(
        [sys.executable, "-m", "fleetlens", "agent", "--collector",
         f"127.0.0.1:{free_port()}", "--fake-gpus", "1", "--host-name", "h"],
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # a few seconds of samples, none deliverable
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 1, err
    assert "not delivered at shutdown" in err and "Traceback" not in err, err


def test_gpus_that_appear_after_start_are_sampled(sink: OtlpSink, monkeypatch) -> None:
    import threading
    import time

    from fleetlens.collector.agent import runner
    from fleetlens.collector.agent.gpu import NoGpu

    monkeypatch.setattr(runner, "GPU_RETRY_S", 0.2)
    tries = []

    def reopen():  # the driver loads on the third try
        tries.append(1)
        if len(tries) < 3:
            raise NoGpu("Driver Not Loaded")
        return FakeGpuBackend(2)

    config = AgentConfig(collector=sink.endpoint, host_name="gpu-host-1",
                         scrape_interval_s=0.1, gpu_interval_s=0.05, export_interval_s=0.2)
    agent = Agent(config, None, reopen_gpus=reopen)
    worker = threading.Thread(target=agent.run)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                p.name == a.HW_POWER for p in sink.points()):
            time.sleep(0.1)
    finally:
        agent.stop()
        worker.join(30)
    assert len(tries) == 3 and agent.sampler is not None
    assert {p.attributes[a.HW_ID] for p in sink.points() if p.name == a.HW_POWER} == {
        s.uuid for s in agent.sampler.sample()}  # both GPUs, from their first samples on


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


def test_tls_export(tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    with OtlpSink(tls=(key.read_bytes(), cert.read_bytes())) as sink:
        agent = make_agent(sink, FakeGpuBackend(1), tls=True, tls_ca_file=str(cert))
        agent.gpu_tick()
        assert agent.gpu_outbox.flush()
        plain = make_agent(sink, FakeGpuBackend(1), export_timeout_s=2.0)
        plain.gpu_tick()
        assert not plain.gpu_outbox.flush()  # a plaintext client cannot talk to a TLS sink
        assert len(sink.metric_requests) == 1


def test_an_unreadable_vllm_process_is_said_once_not_silently_unmapped(
        tmp_path: Path, monkeypatch, caplog) -> None:
    import logging

    from fleetlens.collector.agent import mapping

    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    (proc / "net" / "tcp").write_text(
        f"{header}  timeout inode\n"
        "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
        "        0 4242 1\n")  # 127.0.0.1:8000 listening, inode 4242
    (proc / "4711" / "fd").mkdir(parents=True)  # vLLM, owned by another user
    real_scandir = os.scandir

    def scandir(path):  # noqa: ANN001, ANN202 - as seen by an unprivileged agent
        if str(path).endswith("4711/fd"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(mapping.os, "scandir", scandir)
    monkeypatch.setattr(mapping, "_DENIED_REPORTED", set())
    with caplog.at_level(logging.WARNING):
        assert mapping.listening_pids(8000, proc) == set()
        assert mapping.listening_pids(8000, proc) == set()  # the next refresh: not again
    (said,) = [r.getMessage() for r in caplog.records]
    assert "port 8000 is listening but its process is not readable" in said
    assert "SYS_PTRACE" in said
