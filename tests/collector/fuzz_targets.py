"""Fuzz targets for the OTLP decoders (protobuf and JSON, three signals) and the OTLP/HTTP
request path, shared by ``tests/collector/test_fuzz.py`` (short, seeded from the corpus) and
``bench/fuzz.py`` (long, coverage-guided with atheris).

The invariant of every target: no crash (any exception other than a documented refusal is a
failure), no hang, exactly accepted + rejected = sent, and the rows that would be stored (the
WAL payload replayed, as at start-up) are exactly the accepted ones, each one of the items sent.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h11
from google.protobuf import json_format

from fleetlens.collector import span_kernel
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.errors import PermanentError
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.otlp_json import parse_json
from fleetlens.collector.rows import to_table
from fleetlens.collector.signals import LOGS, METRICS, SIGNALS, SPANS, Signal
from fleetlens.collector.telemetry import Telemetry
from fleetlens.pipeline.schema import columns as c

CORPUS = Path(__file__).parent / "fuzz_corpus"
#: Statuses the HTTP receiver may answer; anything else is a finding.
HTTP_STATUSES = {200, 400, 404, 405, 408, 411, 413, 415, 431, 501, 503}
#: Small limits so the fuzzer reaches them.
CONFIG = CollectorConfig(max_request_bytes=256 * 1024, max_attributes=16,
                         max_attribute_value_bytes=256, max_clock_skew_s=10 * 365 * 86400.0)
Key = tuple[Any, ...]
#: The receive time of in-process decodes (2027-01-15); seeds are dated 2026-09-22.
RECEIVED_NS = 1_800_000_000 * 10**9
SEED_NS = 1_790_000_000 * 10**9


def sent_keys(signal: Signal, request: Any) -> list[Key]:
    """One key per item of ``request`` (span, data point, log record), from the request."""
    keys: list[Key] = []
    if signal is SPANS:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                keys += [(s.trace_id.hex(), s.span_id.hex(), s.start_time_unix_nano)
                         for s in ss.spans]
    elif signal is METRICS:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    points = getattr(metric, kind).data_points if kind else ()
                    keys += [(p.time_unix_nano, p.start_time_unix_nano) for p in points]
    else:
        for rl in request.resource_logs:
            for sl in rl.scope_logs:
                keys += [(r.severity_number, r.trace_id.hex()) for r in sl.log_records]
    return keys


def stored_keys(signal: Signal, table: Any) -> list[Key]:
    """The same keys, read back from stored rows."""
    cols = table.to_pydict()
    if signal is SPANS:
        return list(zip(cols[c.TRACE_ID], cols[c.SPAN_ID], cols[c.START_NS], strict=True))
    if signal is METRICS:
        return list(zip(cols[c.TS_NS], cols[c.START_NS], strict=True))
    return list(zip(cols[c.SEVERITY_NUMBER], [t or "" for t in cols[c.TRACE_ID]], strict=True))


def rejected_of(signal: Signal, response: Any) -> int:
    return getattr(response.partial_success, signal.partial.DESCRIPTOR.fields[0].name)


class Decoders:
    """In-process targets: the decode an Export runs, and the replay of what the WAL keeps."""

    def __init__(self) -> None:
        self.ingest = Ingest(CONFIG, None, Telemetry())

    def check(self, signal: Signal, request: Any, payload: bytes) -> tuple[int, int]:
        """Decode ``request`` as an Export would; (accepted, rejected) after the invariant."""
        sent = sent_keys(signal, request)
        received_ns = RECEIVED_NS
        payload = self.ingest.known_fields(request, payload)  # what the WAL would keep
        outcome = self.ingest.decode(signal, request, received_ns, payload)
        assert outcome.rows + outcome.rejected == len(sent), (outcome.rows, outcome.rejected)
        # The WAL record replayed as at start-up: exactly the accepted items come back.
        record = SimpleNamespace(signal=signal.code, received_ns=received_ns, payload=payload)
        _, table = self.ingest.replay_table(record)
        assert table.num_rows == outcome.rows, (table.num_rows, outcome.rows)
        assert not Counter(stored_keys(signal, table)) - Counter(sent), "stored an unsent item"
        return outcome.rows, outcome.rejected

    def protobuf(self, signal: Signal, data: bytes) -> None:
        """Target: ``data`` as a protobuf Export request of ``signal``."""
        try:
            request = self.ingest.parse(signal, data)
        except PermanentError:
            return  # refused as a whole: nothing accepted, nothing stored
        self.check(signal, request, data)

    def spans_differential(self, data: bytes) -> None:
        """Target: ``data`` as a span Export, decoded by the C kernel and by Python alone;
        the outcomes (columns, counts, messages, flags) or the refusals must be identical.
        Without the kernel built it is the ``spans_pb`` target."""
        kernel = span_kernel.KERNEL
        if kernel is not None:
            kernel.walk(data)  # any bytes: never a crash (the kernel's own input check)
        try:
            request = self.ingest.parse(SPANS, data)
        except PermanentError:
            return
        if kernel is None:
            self.check(SPANS, request, data)
            return
        assert differential_outcomes(CONFIG, data) is not None

    def json(self, signal: Signal, data: bytes) -> None:
        """Target: ``data`` as an OTLP/JSON Export request of ``signal``."""
        try:
            request = parse_json(signal, data, self.ingest)
        except PermanentError:
            return
        self.check(signal, request, request.SerializeToString())


def differential_outcomes(config: CollectorConfig, payload: bytes) -> tuple[Any, ...] | None:
    """The outcome of a parsed span Export by the kernel, checked equal to Python's.

    Each side gets a fresh :class:`Ingest` (the name budgets start equal). Returns the
    kernel's outcome fields, or None when both refused the same way.
    """
    results = []
    kernel = span_kernel.KERNEL
    try:
        for chosen in (kernel, None):
            span_kernel.KERNEL = chosen
            ingest = Ingest(config, None, Telemetry())
            request = SPANS.request.FromString(payload)
            try:
                out = ingest.decode(SPANS, request, RECEIVED_NS, payload)
            except Exception as exc:  # noqa: BLE001 - compared below, kernel against Python
                results.append((type(exc), str(exc)))
                continue
            for name, values in out.columns.items():  # the kernel's Arrow arrays, if any
                if hasattr(values, "__arrow_array__"):
                    assert values.__arrow_array__().to_pylist() == list(values), name
            stored = to_table(SPANS, out).to_pydict()  # what the buffer and Parquet get
            results.append((stored, out.columns, out.rows, out.rejected, out.messages,
                            out.truncated, out.unknown_fields, out.shared_chars,
                            ingest.names.overflowed, ingest.models.overflowed))
    finally:
        span_kernel.KERNEL = kernel
    kernel_side, python_side = results
    assert kernel_side == python_side, _first_difference(kernel_side, python_side)
    return None if isinstance(kernel_side[0], type) else kernel_side[1:]


def _first_difference(left: tuple[Any, ...], right: tuple[Any, ...]) -> str:
    for i, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                cols = [k for k in a if a.get(k) != b.get(k)]
                return f"field {i}: columns {cols}: {[a[k][:3] for k in cols[:2]]} " \
                       f"vs {[b[k][:3] for k in cols[:2]]}"
            return f"field {i}: kernel {a!r:.300} vs python {b!r:.300}"
    return "different lengths"


def parse_request(raw: bytes) -> tuple[str, dict[str, str], bytes] | None:
    """The client's view of raw request bytes (target, headers, decoded body), or None."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    conn.receive_data(b"")
    head, body = None, b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            else:  # EndOfMessage, ConnectionClosed or NEED_DATA
                break
    except h11.RemoteProtocolError:
        return None
    if head is None or conn.trailing_data[0]:
        return None  # no request, or several (pipelined): not checked one by one
    headers = {k.decode().lower(): v.decode("latin-1") for k, v in head.headers}
    if headers.get("content-encoding", "").strip().lower() == "gzip":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, ValueError, zlib.error):
            return None
    return head.target.decode("latin-1"), headers, body


class HttpPath:
    """Target: raw bytes sent to a real OTLP/HTTP server (h11, thread pool, real WAL)."""

    def __init__(self, root: str | None = None) -> None:
        from fleetlens.collector.http_server import start_http
        from fleetlens.collector.sink import Segments, Sink
        from fleetlens.collector.testing import free_port
        from fleetlens.collector.wal import Wal
        from fleetlens.pipeline.storage import DataDir

        self._tmp = tempfile.TemporaryDirectory(prefix="fleetlens-fuzz-", dir=root)
        data = DataDir(Path(self._tmp.name) / "data")
        self.config = CollectorConfig(http_address=f"127.0.0.1:{free_port()}",
                                      max_request_bytes=CONFIG.max_request_bytes,
                                      http_request_timeout_s=2.0, http_idle_timeout_s=2.0)
        telemetry = Telemetry()
        self.ingest = Ingest(self.config, None, telemetry)
        self.sink = Sink(Segments(data, "fuzz"), Wal(data.wal, "fuzz"), telemetry,
                         flush_rows=10**6, flush_interval_s=3600.0,
                         max_buffered_bytes=256 << 20)
        self.ingest.sink = self.sink
        self.sink.start()
        self.server = start_http(self.config, self.ingest)
        self.data = data

    def accepted(self) -> float:
        return sum(self.ingest.telemetry.total(s.counter) for s in SIGNALS)

    def send(self, raw: bytes) -> None:
        """Send ``raw``, read the answer; check the status and the exact counts."""
        before = self.accepted()
        host, _, port = self.config.http_address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            try:
                sock.sendall(raw)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # refused early and closed: the answer is still readable
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except ConnectionResetError:
                pass
        gained = self.accepted() - before
        # one trip through the server's loop: callbacks reporting a failed connection have run
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.server.loop).result(10)
        assert self.server.loop_errors == 0, "an exception escaped a connection (see the log)"
        responses = _responses(answer)
        assert all(status in HTTP_STATUSES for status, _, _ in responses), answer[:300]
        assert raw == b"" or responses or gained == 0, "stored without an answer"
        parsed = parse_request(raw)
        if parsed is None:
            return  # not one whole request by the client's reading: counts not comparable
        assert len(responses) == 1, f"a whole request got {len(responses)} answers"
        (status, content_type, body), (target, _, sent_body) = responses[0], parsed
        signal = {s.http_path: s for s in SIGNALS}.get(target.split("?")[0])
        if status != 200 or signal is None:
            assert gained == 0, (status, gained)
            return
        is_json = "json" in content_type
        response = (json_format.Parse(body, signal.response()) if is_json
                    else signal.response.FromString(body))
        try:
            request = (parse_json(signal, sent_body, self.ingest) if is_json
                       else signal.request.FromString(sent_body))
        except Exception:  # noqa: BLE001 - any refusal of the client-side parse
            return  # the client-side view differs (e.g. framing the server read otherwise)
        sent = len(sent_keys(signal, request))
        assert gained + rejected_of(signal, response) == sent, (gained, sent)

    def close(self) -> None:
        self.server.shutdown(1.0)
        self.sink.close()
        self._tmp.cleanup()


def _responses(answer: bytes) -> list[tuple[int, str, bytes]]:
    conn = h11.Connection(h11.CLIENT)
    # h11 needs a request sent to read responses; any POST frames them the same way
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"),
                                                               ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(answer)
    conn.receive_data(b"")
    found: list[tuple[int, str, bytes]] = []
    status, content_type, body = 0, "", b""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:  # no answer at all, or a torn one
            break
        if isinstance(event, h11.InformationalResponse):
            continue  # 100 Continue: the answer follows
        if isinstance(event, h11.Response):
            status = event.status_code
            content_type = dict(event.headers).get(b"content-type", b"").decode()
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            found.append((status, content_type, body))
            break  # one response per connection is all a one-request input can get
        else:
            break
    return found


def targets(decoders: Decoders) -> dict[str, Callable[[bytes], None]]:
    """Every in-process decoder target by name (the corpus folder of each)."""
    found: dict[str, Callable[[bytes], None]] = {}
    for signal in SIGNALS:
        found[f"{signal.folder}_pb"] = lambda d, s=signal: decoders.protobuf(s, d)
        found[f"{signal.folder}_json"] = lambda d, s=signal: decoders.json(s, d)
    found["spans_kernel"] = decoders.spans_differential
    return found


def corpus(name: str) -> list[tuple[str, bytes]]:
    """The seed and regression inputs of a target, sorted by file name."""
    folder = CORPUS / name
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()]


__all__ = ["CORPUS", "LOGS", "METRICS", "SPANS", "Decoders", "HttpPath", "corpus", "targets"]
