"""Fuzzing in ``make test``: the regression corpus replayed through every target, a few
seconds of coverage-guided fuzzing (atheris) or, without atheris, Hypothesis byte mutation of
the corpus, and the corpus through a real collector process with stored == acknowledged.

Long runs: ``bench/fuzz.py --seconds 600``. Targets and invariant: ``fuzz_targets.py``.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlens.collector.signals import SIGNALS
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema.tables import RAW_SIGNALS
from fleetlens.pipeline.storage import DataDir, scan
from tests.collector.fuzz_targets import (
    CORPUS,
    HTTP_STATUSES,
    Decoders,
    HttpPath,
    corpus,
    targets,
)
from tests.conftest import REPO

NAMES = ("spans_pb", "spans_json", "metrics_pb", "metrics_json", "logs_pb", "logs_json")


def _all_inputs() -> list[tuple[str, bytes]]:
    """Findings of ``--target all`` runs: the first byte picks the target."""
    folder = CORPUS / "all"
    return sorted((p.name, p.read_bytes()) for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("name", NAMES)
def test_the_decoder_corpus_replays_without_a_finding(name) -> None:
    target = targets(Decoders())[name]
    inputs = corpus(name)
    assert inputs, f"no corpus for {name}"
    for _, data in inputs:
        target(data)


def test_the_http_corpus_replays_without_a_finding() -> None:
    http = HttpPath()
    try:
        for _, data in corpus("http"):
            http.send(data)
        chosen = {**targets(Decoders()), "http": http.send}
        order = [*NAMES, "http"]  # bench/fuzz.py --target all: this order, by first byte
        for _, data in _all_inputs():
            if data:
                chosen[order[data[0] % len(order)]](data[1:])
    finally:
        http.close()


@pytest.mark.slow
def test_a_short_coverage_guided_run_finds_nothing() -> None:
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed; test_mutated_corpus_inputs covers this run")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "fuzz.py"), "--target", "all",
                           "--seconds", "3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, value in edits:
        at = where % (len(out) + 1)
        if kind == 0 and out:
            out[at % len(out)] ^= 1 << (value % 8)
        elif kind == 1:
            out[at:at] = bytes([value % 256])
        elif kind == 2:
            del out[at:at + 1 + value % 16]
        else:
            out = out[:at]
    return bytes(out)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(pick=st.integers(0, 10**6), edits=st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 255)), max_size=6))
def test_mutated_corpus_inputs_keep_the_invariant(pick, edits) -> None:
    seeds = [(name, data) for name in NAMES for _, data in corpus(name)]
    name, data = seeds[pick % len(seeds)]
    targets(DECODERS)[name](_mutate(data, edits))


DECODERS = Decoders()


def _post(url: str, body: bytes, content_type: str) -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        with err:
            return err.code


def _received(col) -> Counter[str]:
    with urllib.request.urlopen(f"{col.http_url}/metrics", timeout=30) as resp:
        lines = resp.read().decode().splitlines()
    values = {line.split()[0]: float(line.split()[1]) for line in lines
              if line and not line.startswith("#")}
    return Counter({s.folder: int(values[f"fleetlens_collector_{s.counter}_total"])
                    for s in SIGNALS})


@pytest.mark.e2e
def test_the_corpus_through_a_real_collector_stores_exactly_what_was_acknowledged(
        tmp_path) -> None:
    data = tmp_path / "data"
    acked: Counter[str] = Counter()
    with running_collector(data) as col:
        for signal in SIGNALS:
            url = f"{col.http_url}{signal.http_path}"
            for encoding, content_type in (("pb", "application/x-protobuf"),
                                           ("json", "application/json")):
                for _, body in corpus(f"{signal.folder}_{encoding}"):
                    before = _received(col)
                    assert _post(url, body, content_type) in (200, 400, 413)
                    gained = _received(col) - before
                    assert set(gained) <= {signal.folder}, gained
                    acked += gained
        host, _, port = col.http_address.rpartition(":")
        for _, raw in corpus("http"):  # raw HTTP, framing cases included
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(raw)
                sock.shutdown(socket.SHUT_WR)
                answer = sock.recv(65536)
            assert int(answer.split(b" ", 2)[1]) in HTTP_STATUSES, answer[:200]
        acked = _received(col)  # everything the collector acknowledged
        assert col.stop() == 0
    assert acked, "the corpus should be partly accepted"
    for signal in SIGNALS:
        table = RAW_SIGNALS[signal.folder]
        assert scan(DataDir(data), table).collect().height == acked[signal.folder], table
