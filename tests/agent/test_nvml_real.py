"""The real pynvml path on this machine (no GPU): NVML's own message, one line, and the agent
process goes on scraping vLLM and exporting engine metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fleetlens.collector.agent.gpu import NoGpu, open_nvml
from fleetlens.pipeline.schema import attributes as a
from tests.agent.otlp_sink import OtlpSink
from tests.agent.test_scraper import metrics_server  # noqa: F401  (fixture)
from tests.conftest import REPO

NO_GPU_LINE = ("no NVIDIA GPU/driver: NVML Shared Library Not Found; GPU sampling off (NVML "
               "is tried again every minute)")


def _has_nvml() -> bool:
    try:
        open_nvml().close()
        return True
    except NoGpu:
        return False


@pytest.mark.skipif(_has_nvml(), reason="this host has an NVIDIA driver")
def test_real_pynvml_without_a_gpu_raises_nogpu_with_nvml_message() -> None:
    with pytest.raises(NoGpu, match="^NVML Shared Library Not Found$"):
        open_nvml()


@pytest.mark.skipif(_has_nvml(), reason="this host has an NVIDIA driver")
@pytest.mark.e2e
def test_agent_process_without_gpu_says_so_once_and_scrapes(metrics_server) -> None:  # noqa: F811
    server, _ = metrics_server
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with OtlpSink() as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "agent", "--collector", sink.endpoint,
             "--vllm", f"h/tiny-0={url}", "--scrape-interval", "0.2", "--host-name", "h"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "FLEETLENS_CONFIG": ""})
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                    p.name == a.ENGINE_NUM_RUNNING for p in sink.points()):
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        lines = (out + err).splitlines()
        assert lines.count(NO_GPU_LINE) == 1, lines
        running = [p for p in sink.points() if p.name == a.ENGINE_NUM_RUNNING]
        assert running and running[0].attributes[a.ENGINE_INSTANCE] == "h/tiny-0"
        assert not any(p.name == a.HW_POWER for p in sink.points())


@pytest.mark.e2e
def test_agent_process_with_fake_gpus_exports_them() -> None:
    with OtlpSink() as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "agent", "--collector", sink.endpoint,
             "--fake-gpus", "2", "--host-name", "demo-host"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "FLEETLENS_CONFIG": ""})
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(
                    {p.attributes[a.GPU_INDEX] for p in sink.points() if p.name == a.HW_POWER}) < 2:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "no NVIDIA GPU" not in out + err
        power = [p for p in sink.points() if p.name == a.HW_POWER]
        assert {p.attributes[a.GPU_INDEX] for p in power} == {0, 1}
        assert {p.resource[a.HOST_NAME] for p in power} == {"demo-host"}
