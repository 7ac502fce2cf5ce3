"""dcgm-exporter as the GPU source: a recorded exposition (NVIDIA's documented fields and the
label set dcgm-exporter writes: gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION, container, namespace, pod; blanks where a field is unsupported) mapped
onto the hw.* names, and end to end: a real HTTP server, the real agent process (``--dcgm``),
the real collector, the pipeline CLI, and ``gpu_samples`` / ``instance_gpus`` /
``engine_samples`` read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetlens.collector.agent.dcgm import DcgmSource, dcgm_samples
from fleetlens.collector.agent.sampler import EnergyTotal
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.storage import DataDir, connect
from tests.agent.test_scraper import metrics_server  # noqa: F401  (fixture)

DATA = Path(__file__).parent / "data"
DCGM = (DATA / "dcgm-exporter-3.3-metrics.txt").read_text()
GPU0, GPU1, GPU2 = ("GPU-5a2c7b1e-3f4d-9e8a-1b6c-0d7e2f9a4c31",
                    "GPU-8e41d0f2-6a7b-4c3d-9f1e-2b5a8c7d6e40",
                    "GPU-c93f2a18-0b4e-7d6c-5a2f-8e1d3b9c0a57")
MIB = 1024 * 1024
H100 = "NVIDIA H100 80GB HBM3"


def test_recorded_exposition_maps_onto_gpu_samples() -> None:
    g0, g1, g2 = dcgm_samples(DCGM, ts_ns=5, energy={})
    assert [(g.index, g.uuid, g.name, g.ts_ns) for g in (g0, g1, g2)] == [
        (0, GPU0, H100, 5), (1, GPU1, H100, 5), (2, GPU2, H100, 5)]
    assert g0.power_w == 512.337 and g0.power_limit_w == 700.0
    assert g0.energy_j == 1839274651203 / 1000  # mJ -> J
    assert (g0.util_gpu, g0.util_mem) == (0.97, 0.58)  # % -> 0..1 (MEM_COPY_UTIL: busy share)
    assert g0.mem_used_bytes == 71234 * MIB
    assert g0.mem_limit_bytes == (71234 + 9783 + 542) * MIB  # used + free + reserved
    assert (g0.temp_c, g0.sm_clock_mhz) == (61.0, 1980)
    assert [g.clocks_event_reasons for g in (g0, g1, g2)] == [0, 4, 1]  # SwPowerCap, GpuIdle
    assert g0.pods == g1.pods == ("inference/vllm-llama-0",) and g2.pods == ()
    assert g0.extra["gpu.prof.pipe_tensor_active"] == 0.412077
    assert g0.extra["gpu.xid.last"] == 0.0 and g2.extra["gpu.xid.last"] == 31.0
    # DCGM's blank for an unsupported field (2**47 for doubles) is no value, not a number
    assert "gpu.prof.dram_active" in g1.extra and "gpu.prof.dram_active" not in g2.extra


def test_energy_is_kept_monotonic_across_scrapes_and_blanks_are_skipped() -> None:
    energy: dict[str, EnergyTotal] = {}
    key = f'{a.DCGM_TOTAL_ENERGY}{{gpu="0",UUID="{GPU0}",modelName="m"}}'
    power = f'{a.DCGM_POWER_USAGE}{{gpu="0",UUID="{GPU0}",modelName="m"}}'
    (first,) = dcgm_samples(f"{key} 5000\n{power} 9223372036854775794\n", 1, energy)
    (second,) = dcgm_samples(f"{key} 8000\n{power} 300.5\n", 2, energy)
    (reset,) = dcgm_samples(f"{key} 1000\n", 3, energy)  # driver reload: the counter restarts
    assert [first.energy_j, second.energy_j, reset.energy_j] == [5.0, 8.0, 9.0]
    assert (first.power_w, second.power_w) == (None, 300.5)


def test_a_failing_exporter_gives_no_samples_and_is_logged_once(caplog) -> None:
    replies = iter([OSError("connection refused"), OSError("again"), DCGM])

    def fetch(url: str, timeout_s: float) -> str:
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    source = DcgmSource("http://127.0.0.1:9400/metrics", fetch=fetch)
    assert source.sample() == [] and source.sample() == []
    assert sum("scrape failed" in r.getMessage() for r in caplog.records) == 1
    assert len(source.sample()) == 3 and not source.failing


def _pipeline(data: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    # gpu_samples rows of 0.1 s, under the agent's 0.3 s scrapes: each reading its own row.
    # At the 1 s default the old and the new counter reading could share a row, whose
    # energy_j is its last reading (CI: the first row already held the new value).
    env["FLEETLENS_PIPELINE__GPU_SAMPLE_INTERVAL_S"] = "0.1"
    out = subprocess.run([sys.executable, "-m", "fleetlens", "pipeline", "--data-dir",
                          str(data), "--json"], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr


@pytest.mark.e2e
def test_dcgm_exporter_to_agent_to_collector_to_gpu_samples(tmp_path, metrics_server) -> None:  # noqa: F811
    dcgm, dcgm_handler = _server()
    vllm_server, vllm_handler = metrics_server
    vllm_handler.body = vllm_handler.body.replace(
        b'finished_reason="abort",model_name="tiny"} 0.0',
        b'finished_reason="abort",model_name="tiny"} 3.0')
    config = tmp_path / "fleetlens.toml"
    config.write_text(
        "[agent]\n"
        f'dcgm = "http://127.0.0.1:{dcgm.server_address[1]}/metrics"\n'
        'host_name = "gpu-node-07"\nscrape_interval_s = 0.3\nexport_interval_s = 0.3\n'
        "[[agent.vllm]]\n"
        f'url = "http://127.0.0.1:{vllm_server.server_address[1]}"\n'
        'instance_id = "gpu-node-07/llama-0"\npod = "inference/vllm-llama-0"\n')
    data = tmp_path / "data"
    with running_collector(data) as col:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
        agent = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "agent", "--config", str(config),
             "--collector", col.grpc_address], env=env, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: len(dcgm_handler.hits) >= 3, agent)  # scraped a few times
            # dcgm-exporter's next reading: 100 J more on GPU 0
            dcgm_handler.body = DCGM.replace(" 1839274651203", " 1839274751203").encode()
            seen = len(dcgm_handler.hits)
            _wait_for(lambda: len(dcgm_handler.hits) >= seen + 3, agent)
        finally:
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err
        assert "GPUs from dcgm-exporter" in err and "no NVIDIA GPU" not in err, err
        assert col.stop() == 0
    _pipeline(data)

    con = connect(DataDir(data))
    gpu = con.sql("select * from gpu_samples order by gpu_uuid, ts_ns").pl()
    assert set(gpu["gpu_uuid"]) == {GPU0, GPU1, GPU2}
    assert set(gpu["host_name"]) == {"gpu-node-07"} and set(gpu["gpu_model"]) == {H100}
    g0 = gpu.filter(gpu["gpu_uuid"] == GPU0)
    first = g0.row(0, named=True)
    assert first["gpu_index"] == 0 and first["power_w"] == pytest.approx(512.337)
    assert first["util_gpu"] == pytest.approx(0.97) and first["util_mem"] == pytest.approx(0.58)
    assert first["mem_used_bytes"] == 71234 * MIB and first["temp_c"] == 61.0
    assert first["sm_clock_mhz"] == 1980 and first["power_limit_w"] == 700.0
    assert first["mem_total_bytes"] == (71234 + 9783 + 542) * MIB
    assert g0["energy_j"].min() == pytest.approx(1839274651.203, abs=1e-3)
    assert g0["energy_j"].max() == pytest.approx(1839274751.203, abs=1e-3)  # +100 J
    assert g0["energy_delta_j"].sum() == pytest.approx(100.0)
    g1 = gpu.filter(gpu["gpu_uuid"] == GPU1).row(0, named=True)
    assert g1["clocks_event_reasons"] == 4
    # the vLLM pod's GPUs, from dcgm-exporter's pod labels
    mapped = con.sql("select distinct instance_id, gpu_uuid from instance_gpus "
                     "where gpu_uuid <> '' order by gpu_uuid").fetchall()
    assert mapped == [("gpu-node-07/llama-0", GPU0), ("gpu-node-07/llama-0", GPU1)]
    engine = con.sql("select * from engine_samples order by ts_ns").pl()
    last = engine.row(-1, named=True)
    assert last["requests_aborted_total"] == 3.0 and last["requests_finished_total"] == 30.0
    assert last["kv_capacity_tokens"] == 32768 * 128


def _wait_for(condition, process: subprocess.Popen, timeout_s: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the agent did not scrape dcgm-exporter"
        time.sleep(0.05)


def _server():  # noqa: ANN202
    """A second real HTTP server (dcgm-exporter's side) counting the scrapes it answers."""
    import http.server
    import threading

    from tests.agent.test_scraper import _Handler

    class Counting(_Handler):
        hits: list[int] = []
        body = DCGM.encode()

        def do_GET(self) -> None:  # noqa: N802
            super().do_GET()
            self.hits.append(1)

    handler = type("Dcgm", (Counting,), {"hits": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


def test_pods_map_instances_to_gpus_by_namespace_and_name() -> None:
    from fleetlens.collector.agent.mapping import gpus_from_pod

    samples = dcgm_samples(DCGM, ts_ns=1, energy={})
    assert gpus_from_pod("inference/vllm-llama-0", samples) == (GPU0, GPU1)
    assert gpus_from_pod("vllm-llama-0", samples) == (GPU0, GPU1)  # any namespace
    assert gpus_from_pod("other/vllm-llama-0", samples) == ()


def test_fixture_uses_dcgm_exporters_label_set() -> None:
    first = next(line for line in DCGM.splitlines() if not line.startswith("#"))
    labels = [part.split("=")[0] for part in first.split("{")[1].split("}")[0].split(",")]
    assert labels == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                      "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod"]
    assert DCGM.count(" 9223372036854775794\n") == 3  # MEMORY_TEMP: DCGM's int blank
