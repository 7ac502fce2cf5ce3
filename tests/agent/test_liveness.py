"""Engine liveness, start time and configuration, and the agent heartbeat (issue 30), through
the agent's real scrape loop step, a real vLLM-like HTTP server on 127.0.0.1 (``/metrics``,
``/version``, ``/v1/models``) that the tests stop, restart and change, and the real OTLP SDK
exporter into a gRPC sink."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from fleetlens.collector.agent import liveness
from fleetlens.collector.agent.config import VllmTarget
from fleetlens.collector.agent.instruments import ENGINE_METRICS
from fleetlens.collector.agent.runner import Agent
from fleetlens.pipeline.schema import attributes as a
from tests.agent.otlp_sink import OtlpSink, Point
from tests.agent.test_agent import make_agent, sink  # noqa: F401  (fixture)
from tests.agent.test_scraper import NEW

START = "process_start_time_seconds 1.79597042086e+09"
INSTANCE = "gpu-host-1/tiny-0"
LIVENESS = {a.ENGINE_UP, a.ENGINE_START_TIME, a.ENGINE_CONFIG_INFO}


class VllmLike:
    """A vLLM-like server: its pages can change, it can stop and start again on its port."""

    def __init__(self) -> None:
        self.metrics = NEW
        self.version = "0.32.0"
        self.models = [{"id": "tiny", "object": "model", "max_model_len": 2048}]
        self.status: dict[str, int] = {}  # path -> an HTTP error status to answer with
        self.hits: Counter[str] = Counter()
        self.port = 0
        self._server: http.server.ThreadingHTTPServer | None = None

    def _body(self, path: str) -> bytes:
        if path == "/version":
            return json.dumps({"version": self.version}).encode()
        if path == "/v1/models":
            return json.dumps({"object": "list", "data": self.models}).encode()
        return self.metrics.encode()

    def start(self) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.hits[self.path] += 1
                self.send_response(owner.status.get(self.path, 200))
                self.end_headers()
                self.wfile.write(owner._body(self.path))

            def log_message(self, *args: object) -> None:
                pass

        # HTTPServer sets SO_REUSEADDR: a restart can take the same port again at once.
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def vllm():
    server = VllmLike()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def tick(agent: Agent, sink: OtlpSink) -> list[Point]:  # noqa: F811
    """One scrape round, shipped; the points it sent."""
    before = len(sink.points())
    agent.engine_tick()
    assert agent.engine_outbox.flush()
    return sink.points()[before:]


def named(points: list[Point], name: str) -> list[Point]:
    return [p for p in points if p.name == name]


def one(points: list[Point], name: str) -> Point:
    (point,) = named(points, name)
    return point


def agent_for(sink: OtlpSink, url: str) -> Agent:  # noqa: F811
    return make_agent(sink, None, [VllmTarget(url=url, instance_id=INSTANCE)])


def test_up_start_time_config_and_heartbeat_of_a_live_engine(sink, vllm) -> None:  # noqa: F811
    points = tick(agent_for(sink, vllm.url), sink)
    engine = {a.ENGINE_INSTANCE: INSTANCE, a.ENGINE_MODEL_NAME: "tiny"}
    up = one(points, a.ENGINE_UP)
    assert (up.value, up.kind, up.unit, up.attributes) == (1, "gauge", "1", engine)
    start = one(points, a.ENGINE_START_TIME)
    assert (start.value, start.unit, start.attributes) == (1.79597042086e9, "s", engine)
    config = one(points, a.ENGINE_CONFIG_INFO)
    assert config.value == 1 and config.attributes[a.ENGINE_VERSION] == "0.32.0"
    body = json.loads(config.attributes[a.ENGINE_CONFIG_JSON])
    assert body["models"] == {"tiny": 2048} and body["version"] == "0.32.0"
    assert body["cache_config"]["num_gpu_blocks"] == "32768"
    assert body["cache_config"]["enable_prefix_caching"] == "True"
    assert "engine" not in body["cache_config"]  # the same on every engine of the server
    assert config.attributes[a.ENGINE_CONFIG_JSON] == json.dumps(body, sort_keys=True,
                                                                 separators=(",", ":"))
    fingerprint = config.attributes[a.ENGINE_CONFIG_FINGERPRINT]
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    beat = one(points, a.AGENT_HEARTBEAT)
    assert (beat.value, beat.attributes) == (1, {})
    assert beat.resource[a.HOST_NAME] == "gpu-host-1"
    assert beat.resource[a.SERVICE_NAME] == "fleetlens-agent"


def test_a_stopped_engine_is_up_0_alone_and_the_heartbeat_goes_on(sink, vllm) -> None:  # noqa: F811
    agent = agent_for(sink, vllm.url)
    tick(agent, sink)
    vllm.stop()  # connection refused from now on
    points = tick(agent, sink)
    up = one(points, a.ENGINE_UP)
    # the same series as while it was up: the model is known from the earlier scrape
    assert (up.value, up.attributes) == (0, {a.ENGINE_INSTANCE: INSTANCE,
                                             a.ENGINE_MODEL_NAME: "tiny"})
    assert not [p for p in points if p.name in ENGINE_METRICS or p.name in
                (a.ENGINE_START_TIME, a.ENGINE_CONFIG_INFO, a.ENGINE_REQUESTS_FINISHED)]
    assert one(points, a.AGENT_HEARTBEAT).value == 1


def test_restart_gives_a_new_start_time_and_fetches_the_info_again(sink, vllm) -> None:  # noqa: F811
    agent = agent_for(sink, vllm.url)
    first = tick(agent, sink)
    for _ in range(4):
        tick(agent, sink)
    assert vllm.hits["/version"] == 1 and vllm.hits["/v1/models"] == 1  # not at every scrape
    assert vllm.hits["/metrics"] == 5
    vllm.stop()
    assert one(tick(agent, sink), a.ENGINE_UP).value == 0
    vllm.metrics = NEW.replace(START, "process_start_time_seconds 1.79597100000e+09")
    vllm.version = "0.32.1"  # a deploy of another version
    vllm.start()
    points = tick(agent, sink)
    assert one(points, a.ENGINE_UP).value == 1
    assert one(points, a.ENGINE_START_TIME).value == 1.795971e9
    assert vllm.hits["/version"] == 2
    old, new = (one(p, a.ENGINE_CONFIG_INFO).attributes for p in (first, points))
    assert new[a.ENGINE_VERSION] == "0.32.1"
    assert new[a.ENGINE_CONFIG_FINGERPRINT] != old[a.ENGINE_CONFIG_FINGERPRINT]


def test_a_new_start_time_alone_refetches_version_and_models(sink, vllm) -> None:  # noqa: F811
    agent = agent_for(sink, vllm.url)
    tick(agent, sink)
    # restarted between two scrapes (never seen down), with a longer context
    vllm.metrics = NEW.replace(START, "process_start_time_seconds 1.79597200000e+09")
    vllm.models = [{"id": "tiny", "object": "model", "max_model_len": 4096}]
    config = one(tick(agent, sink), a.ENGINE_CONFIG_INFO)
    assert json.loads(config.attributes[a.ENGINE_CONFIG_JSON])["models"] == {"tiny": 4096}
    assert vllm.hits["/v1/models"] == 2


def test_changed_cache_config_labels_change_the_fingerprint(sink, vllm) -> None:  # noqa: F811
    agent = agent_for(sink, vllm.url)
    before = one(tick(agent, sink), a.ENGINE_CONFIG_INFO).attributes
    assert one(tick(agent, sink), a.ENGINE_CONFIG_INFO).attributes == before  # stable
    vllm.metrics = NEW.replace('block_size="128"', 'block_size="16"', 1)
    after = one(tick(agent, sink), a.ENGINE_CONFIG_INFO).attributes
    assert after[a.ENGINE_CONFIG_FINGERPRINT] != before[a.ENGINE_CONFIG_FINGERPRINT]
    assert json.loads(after[a.ENGINE_CONFIG_JSON])["cache_config"]["block_size"] == "16"
    assert vllm.hits["/version"] == 1  # read from the page, nothing fetched again


def test_version_is_refreshed_every_few_minutes_and_a_failure_keeps_it(
        sink, vllm, monkeypatch) -> None:  # noqa: F811
    real, offset = time.monotonic, [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: real() + offset[0])
    agent = agent_for(sink, vllm.url)
    tick(agent, sink)
    vllm.version = "0.33.0"  # an in-place upgrade the page does not show
    offset[0] += liveness.INFO_REFRESH_S / 2
    assert one(tick(agent, sink), a.ENGINE_CONFIG_INFO).attributes[a.ENGINE_VERSION] == "0.32.0"
    offset[0] += liveness.INFO_REFRESH_S / 2  # a few minutes after the first fetch
    assert one(tick(agent, sink), a.ENGINE_CONFIG_INFO).attributes[a.ENGINE_VERSION] == "0.33.0"
    assert vllm.hits["/version"] == 2
    vllm.status.update({"/version": 500, "/v1/models": 404})
    offset[0] += liveness.INFO_REFRESH_S
    config = one(tick(agent, sink), a.ENGINE_CONFIG_INFO).attributes
    assert vllm.hits["/version"] == 3 and vllm.hits["/v1/models"] == 3
    assert config[a.ENGINE_VERSION] == "0.33.0"  # the previous answers, not none
    assert json.loads(config[a.ENGINE_CONFIG_JSON])["models"] == {"tiny": 2048}
    vllm.status.clear()
    offset[0] += liveness.INFO_RETRY_S  # after a failure: tried again sooner
    tick(agent, sink)
    assert vllm.hits["/version"] == 4


def test_an_engine_down_from_the_start_has_its_instance_and_no_model(sink) -> None:  # noqa: F811
    from fleetlens.collector.testing import free_port

    points = tick(agent_for(sink, f"http://127.0.0.1:{free_port()}"), sink)
    up = one(points, a.ENGINE_UP)
    assert (up.value, up.attributes) == (0, {a.ENGINE_INSTANCE: INSTANCE})
    assert named(points, a.ENGINE_START_TIME) == named(points, a.ENGINE_CONFIG_INFO) == []


@pytest.mark.parametrize("fault", ["http_500", "garbage", "timeout"])
def test_every_kind_of_failed_scrape_is_up_0(sink, vllm, fault) -> None:  # noqa: F811
    agent = agent_for(sink, vllm.url)
    assert one(tick(agent, sink), a.ENGINE_UP).value == 1
    if fault == "http_500":
        vllm.status["/metrics"] = 500
    elif fault == "garbage":
        vllm.metrics = "garbage{ line\n"
    else:
        agent.scraper.timeout_s = 1.0
        vllm.stop()
        hung = socket.create_server(("127.0.0.1", vllm.port))  # accepts, never answers
    try:
        points = tick(agent, sink)
    finally:
        if fault == "timeout":
            hung.close()
    assert one(points, a.ENGINE_UP).value == 0
    assert not [p for p in points if p.name in ENGINE_METRICS]
    # only a scrape that timed out says the engine took the connection and never answered
    assert one(points, a.ENGINE_UNRESPONSIVE).value == (1 if fault == "timeout" else 0)


def test_a_refused_scrape_is_not_unresponsive_and_an_answer_clears_it(sink, vllm) -> None:  # noqa: F811
    agent = agent_for(sink, vllm.url)
    agent.scraper.timeout_s = 1.0
    assert one(tick(agent, sink), a.ENGINE_UNRESPONSIVE).value == 0
    vllm.stop()
    hung = socket.create_server(("127.0.0.1", vllm.port))  # a stopped process: no answer
    try:
        assert one(tick(agent, sink), a.ENGINE_UNRESPONSIVE).value == 1
    finally:
        hung.close()
    assert one(tick(agent, sink), a.ENGINE_UNRESPONSIVE).value == 0  # refused: gone
    vllm.start()
    points = tick(agent, sink)
    assert (one(points, a.ENGINE_UP).value, one(points, a.ENGINE_UNRESPONSIVE).value) == (1, 0)


def test_several_targets_one_down_one_up(sink, vllm) -> None:  # noqa: F811
    from fleetlens.collector.testing import free_port

    agent = make_agent(sink, None, [VllmTarget(url=vllm.url, instance_id="h/up"),
                                    VllmTarget(url=f"http://127.0.0.1:{free_port()}",
                                               instance_id="h/down")])
    try:
        points = tick(agent, sink)
    finally:
        agent.scraper.close()
    assert {p.attributes[a.ENGINE_INSTANCE]: p.value for p in named(points, a.ENGINE_UP)} == {
        "h/up": 1, "h/down": 0}
    assert {p.attributes[a.ENGINE_INSTANCE] for p in named(points, a.ENGINE_CONFIG_INFO)} == {
        "h/up"}


def test_heartbeat_without_targets_or_gpus(sink) -> None:  # noqa: F811
    agent = make_agent(sink, None)
    points = tick(agent, sink) + tick(agent, sink)
    assert [p.value for p in points] == [1, 1]
    assert {p.name for p in points} == {a.AGENT_HEARTBEAT}


def test_the_agent_process_says_up_then_down_and_keeps_its_heartbeat(sink, vllm) -> None:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    child = subprocess.Popen(
        [sys.executable, "-m", "fleetlens", "agent", "--collector", sink.endpoint,
         "--vllm", f"{INSTANCE}={vllm.url}", "--host-name", "h", "--scrape-interval", "0.2"],
        env=env, stderr=subprocess.PIPE, text=True)

    def wait_for(value: int) -> None:
        deadline = time.monotonic() + 60
        while not any(p.name == a.ENGINE_UP and p.value == value for p in sink.points()):
            assert child.poll() is None and time.monotonic() < deadline, "no up point"
            time.sleep(0.1)

    try:
        wait_for(1)
        vllm.stop()
        wait_for(0)
        beats = len(named(sink.points(), a.AGENT_HEARTBEAT))
        deadline = time.monotonic() + 60
        while len(named(sink.points(), a.AGENT_HEARTBEAT)) <= beats:  # still beating
            assert time.monotonic() < deadline, "the heartbeat stopped"
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    assert "Traceback" not in err, err
    down = [p for p in sink.points() if p.name == a.ENGINE_UP and p.value == 0]
    assert {p.attributes[a.ENGINE_MODEL_NAME] for p in down} == {"tiny"}
    assert {p.resource[a.HOST_NAME] for p in named(sink.points(), a.AGENT_HEARTBEAT)} == {"h"}
