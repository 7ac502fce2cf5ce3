"""The vLLM /metrics scraper against real exposition text of a new (0.32, captured from the real
server under load) and an older (0.8-style names) vLLM, and over real HTTP."""

from __future__ import annotations

import http.server
import logging
import math
import threading
from pathlib import Path

import pytest

from fleetlens.collector.agent.prometheus import ExpositionError, parse_samples
from fleetlens.collector.agent.scraper import VllmScraper, engine_samples
from fleetlens.pipeline.schema import attributes as a

DATA = Path(__file__).parent / "data"
NEW = (DATA / "vllm-0.32.0-metrics.txt").read_text()
OLD = (DATA / "vllm-0.8-style-metrics.txt").read_text()


def test_new_vllm_text() -> None:
    (sample,) = engine_samples(NEW, "host-a/vllm", ts_ns=7)
    assert (sample.instance_id, sample.model_name, sample.ts_ns) == ("host-a/vllm", "tiny", 7)
    assert sample.values == {
        a.ENGINE_KV_CACHE_USAGE: pytest.approx(0.002441480758079817),
        a.ENGINE_NUM_RUNNING: 40.0,
        a.ENGINE_NUM_WAITING: 0.0,
        a.ENGINE_PREEMPTIONS: 0.0,
        a.ENGINE_PREFIX_CACHE_QUERIES: 3098.0,
        a.ENGINE_PREFIX_CACHE_HITS: 0.0,
        a.ENGINE_PROMPT_TOKENS: 3098.0,
        a.ENGINE_GENERATION_TOKENS: 9308.0,
        # vllm:cache_config_info: num_gpu_blocks 32768 x block_size 128 (= the server's own
        # kv_cache_size_tokens label)
        a.ENGINE_KV_CACHE_CAPACITY: 32768 * 128,
    }
    assert sample.finished == {"stop": 0.0, "length": 27.0, "abort": 0.0, "error": 0.0,
                               "repetition": 0.0}


def test_finished_requests_by_reason_summed_over_engines() -> None:
    family = a.VLLM_REQUEST_SUCCESS
    text = "\n".join([
        f'{family}{{engine="0",finished_reason="stop",model_name="m"}} 90',
        f'{family}{{engine="1",finished_reason="stop",model_name="m"}} 10',
        f'{family}{{engine="0",finished_reason="abort",model_name="m"}} 3',
        f'{family}{{engine="1",finished_reason="error",model_name="m"}} 2',
    ]) + "\n"
    (sample,) = engine_samples(text, "i", 0)
    assert sample.finished == {"stop": 100.0, "abort": 3.0, "error": 2.0}


def test_kv_capacity_from_cache_config_info_of_every_engine() -> None:
    info, running = a.VLLM_CACHE_CONFIG_INFO, a.VLLM_PROMETHEUS_NAMES[a.ENGINE_NUM_RUNNING][0]
    text = "\n".join([
        f'{info}{{block_size="16",engine="0",num_gpu_blocks="1000"}} 1.0',
        f'{info}{{block_size="16",engine="1",num_gpu_blocks="1200"}} 1.0',
        f'{running}{{engine="0",model_name="m"}} 1',
    ]) + "\n"
    assert engine_samples(text, "i", 0)[0].values[a.ENGINE_KV_CACHE_CAPACITY] == 2200 * 16
    unsized = f'{info}{{block_size="16",engine="0",num_gpu_blocks="None"}} 1.0\n'
    assert a.ENGINE_KV_CACHE_CAPACITY not in engine_samples(
        unsized + f'{running}{{model_name="m"}} 1\n', "i", 0)[0].values


def test_prometheus_3_quoted_names_and_labels() -> None:
    # Prometheus 3 / OpenMetrics 2 text: UTF-8 names quoted inside the braces.
    text = ('# TYPE "vllm:num_requests_running" gauge\n'
            '{"vllm:num_requests_running", model_name="m", "some.label"="x"} 6\n')
    (sample,) = engine_samples(text, "i", 0)
    assert sample.values == {a.ENGINE_NUM_RUNNING: 6.0}
    (raw,) = parse_samples(text)
    assert raw.labels == {"model_name": "m", "some.label": "x"}


@pytest.mark.parametrize("text", [NEW, OLD], ids=["0.32", "0.8-style"])
def test_parser_reads_every_sample_line_of_the_fixtures(text: str) -> None:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    samples = parse_samples(text)
    assert [s.name for s in samples] == [line.split("{")[0].split()[0] for line in lines]
    values = [line.rpartition(" ")[2] for line in lines]  # vLLM writes no timestamps
    assert [s.value for s in samples if not math.isnan(s.value)] == [
        float(v) for v in values if v != "NaN"]


def test_old_vllm_names_are_understood() -> None:
    (sample,) = engine_samples(OLD, "i", ts_ns=1)
    assert sample.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert sample.values == {
        a.ENGINE_KV_CACHE_USAGE: 0.8125,
        a.ENGINE_NUM_RUNNING: 7.0,
        a.ENGINE_NUM_WAITING: 3.0,
        a.ENGINE_PREEMPTIONS: 12.0,
        a.ENGINE_PREFIX_CACHE_QUERIES: 152340.0,
        a.ENGINE_PREFIX_CACHE_HITS: 61184.0,
        a.ENGINE_PROMPT_TOKENS: 152340.0,
        a.ENGINE_GENERATION_TOKENS: 48712.0,
    }


def test_every_rename_alias_is_accepted() -> None:
    for signal, names in a.VLLM_PROMETHEUS_NAMES.items():
        for name in names:
            (sample,) = engine_samples(f'{name}{{model_name="m"}} 5\n', "i", 0)
            assert sample.values == {signal: 5.0}, name


def test_newest_name_wins_when_both_are_exposed() -> None:
    new, old = a.VLLM_PROMETHEUS_NAMES[a.ENGINE_KV_CACHE_USAGE]
    text = f'{old}{{model_name="m"}} 0.9\n{new}{{model_name="m"}} 0.25\n'
    assert engine_samples(text, "i", 0)[0].values == {a.ENGINE_KV_CACHE_USAGE: 0.25}


def test_engines_are_summed_and_usage_averaged_per_model() -> None:
    running = a.VLLM_PROMETHEUS_NAMES[a.ENGINE_NUM_RUNNING][0]
    usage = a.VLLM_PROMETHEUS_NAMES[a.ENGINE_KV_CACHE_USAGE][0]
    text = "\n".join([
        f'{running}{{engine="0",model_name="m"}} 3',
        f'{running}{{engine="1",model_name="m"}} 4',
        f'{usage}{{engine="0",model_name="m"}} 0.2',
        f'{usage}{{engine="1",model_name="m"}} 0.6',
        f'{running}{{engine="0",model_name="lora-x"}} 1',
    ])
    m, lora = sorted(engine_samples(text, "i", 0), key=lambda s: s.model_name != "m")
    assert m.values == {a.ENGINE_NUM_RUNNING: 7.0, a.ENGINE_KV_CACHE_USAGE: pytest.approx(0.4)}
    assert (lora.model_name, lora.values) == ("lora-x", {a.ENGINE_NUM_RUNNING: 1.0})


def test_text_without_vllm_families_gives_nothing() -> None:
    assert engine_samples("# nothing\nprocess_open_fds 3\n", "i", 0) == []


def test_parser_handles_escapes_specials_and_timestamps() -> None:
    text = ('x{a="q\\"uote",b="back\\\\slash",c="new\\nline",} 1.5e3 1700000000000\n'
            'y +Inf\nz{} NaN\nw -Inf\n')
    x, y, z, w = parse_samples(text)
    assert x.labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert x.value == 1500.0
    assert y.value == math.inf and w.value == -math.inf and math.isnan(z.value)
    assert z.labels == {}


def test_counters_keep_the_names_they_were_written_with() -> None:
    # prometheus_client appends _total to a counter declared without it; the agent undoes it
    text = ("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
            'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 5\n'
            "# TYPE vllm:num_preemptions_total counter\n"
            'vllm:num_preemptions_total{model_name="m"} 2\n')
    assert [s.name for s in parse_samples(text)] == [
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "vllm:num_preemptions_total"]


@pytest.mark.parametrize("bad", ['x{a=1} 2', "x 1.2.3", '{a="b"} 1', 'x{a="b" 1'])
def test_parser_rejects_malformed_lines_with_the_line_number(bad: str) -> None:
    with pytest.raises(ExpositionError, match="line 2"):
        parse_samples("ok 1\n" + bad)


class _Handler(http.server.BaseHTTPRequestHandler):
    body = NEW.encode()
    status = 200

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server():
    handler = type("H", (_Handler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()


def test_scraper_over_http_logs_failures_once_and_recovers(metrics_server, caplog) -> None:
    server, handler = metrics_server
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    scraper = VllmScraper([("h/vllm", url)], timeout_s=2.0)
    (sample,) = scraper.scrape()
    assert sample.values[a.ENGINE_GENERATION_TOKENS] == 9308.0
    handler.status = 500
    with caplog.at_level(logging.WARNING):
        assert scraper.scrape() == [] and scraper.scrape() == []
    assert sum("scrape failed" in r.getMessage() for r in caplog.records) == 1
    handler.status, handler.body = 200, OLD.encode()
    assert scraper.scrape()[0].values[a.ENGINE_PREEMPTIONS] == 12.0
    assert scraper.failing == set()
    handler.body = b"garbage{ line\n"
    assert scraper.scrape() == []
    assert scraper.failing == {url}


@pytest.fixture
def raw_server():
    """A TCP server that answers every connection with ``reply(conn)``, set by the test."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    state: dict = {"reply": lambda conn: None, "stop": False}

    def serve() -> None:
        while not state["stop"]:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_answer, args=(conn, state["reply"]), daemon=True).start()

    def _answer(conn, reply) -> None:  # noqa: ANN001
        with conn:
            conn.recv(65536)  # the request
            try:
                reply(conn)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", state
    finally:
        state["stop"] = True
        listener.close()


def test_a_garbled_or_dripping_target_costs_only_itself(metrics_server, raw_server) -> None:
    import time

    server, _ = metrics_server
    good = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    bad, state = raw_server
    scraper = VllmScraper([("h/bad", bad), ("h/good", good)], timeout_s=1.0)
    state["reply"] = lambda conn: conn.sendall(b"this is not HTTP\r\n\r\n")
    assert [s.instance_id for s in scraper.scrape()] == ["h/good"]  # BadStatusLine
    state["reply"] = lambda conn: conn.sendall(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")  # cut short
    assert [s.instance_id for s in scraper.scrape()] == ["h/good"]  # IncompleteRead

    sent: list[int] = []
    done = threading.Event()

    def drip(conn) -> None:  # noqa: ANN001 - a byte every 0.2 s: each read is in time
        try:
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(100):
                conn.sendall(b"#")
                sent.append(1)
                time.sleep(0.2)
        finally:
            done.set()  # all sent, or the scraper hung up (a send fails)

    state["reply"] = drip
    assert [s.instance_id for s in scraper.scrape()] == ["h/good"]
    assert scraper.failing == {bad}
    # timeout_s (1 s) bounds the whole exchange, not each read: the scraper hung up long
    # before the 100 bytes were dripped (a per-read timeout would have read them all).
    assert done.wait(60)
    assert len(sent) < 100, len(sent)


def test_targets_are_scraped_side_by_side() -> None:
    # Each fetch waits for the other: scraped one after the other, the first would time out.
    both = threading.Barrier(2)

    def fetch(url: str, timeout_s: float) -> str:
        both.wait(timeout=10)
        return NEW

    scraper = VllmScraper([("h/a", "http://a"), ("h/b", "http://b")], fetch=fetch)
    try:
        assert sorted(s.instance_id for s in scraper.scrape()) == ["h/a", "h/b"]
    finally:
        scraper.close()
