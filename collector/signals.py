"""The three OTLP signals: request/response types, decoder, raw table and wire paths."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb

from fleetlens.collector.decode_common import Outcome
from fleetlens.collector.decode_logs import decode_logs
from fleetlens.collector.decode_metrics import decode_metrics
from fleetlens.collector.decode_spans import decode_spans
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t


@dataclass(frozen=True)
class Signal:
    """One OTLP signal and where its rows go.

    Attributes:
        code: the signal's number in WAL frames.
        folder: the folder under ``raw/`` (``spans``, ``metrics``, ``logs``).
        request: the Export request message class.
        decode: request -> :class:`Outcome` (see ``collector.decode_*``).
        grpc_method: full gRPC method path.
        http_path: OTLP/HTTP path.
        time_column: the column that picks a row's ``date=/hour=`` partition.
        item: what one rejected item is called (for logs and counters).
    """

    code: int
    folder: str
    request: Any
    response: Any
    partial: Any
    rejected_field: str
    decode: Callable[..., Outcome]
    grpc_method: str
    http_path: str
    time_column: str
    counter: str
    #: ``decode`` takes the request's protobuf bytes as a fifth argument.
    reads_payload: bool = False

    @property
    def table(self) -> t.Table:
        return t.table(t.RAW_SIGNALS[self.folder])

    @property
    def arrow_schema(self) -> pa.Schema:
        return _ARROW[self.folder]

    def response_for(self, outcome: Outcome) -> Any:
        """The Export response: empty on full success, else an exact partial success."""
        if not outcome.rejected:
            return self.response()
        partial = self.partial(error_message=outcome.error_message)
        setattr(partial, self.rejected_field, outcome.rejected)
        return self.response(partial_success=partial)

    def to_arrow(self, outcome: Outcome) -> pa.Table:
        """The accepted rows as an Arrow table with the raw table's exact columns."""
        return pa.Table.from_pydict(outcome.columns, schema=self.arrow_schema)


SPANS = Signal(
    1, "spans", trace_pb.ExportTraceServiceRequest, trace_pb.ExportTraceServiceResponse,
    trace_pb.ExportTracePartialSuccess, "rejected_spans", decode_spans,
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export", "/v1/traces",
    c.START_NS, "received_spans", reads_payload=True,
)
METRICS = Signal(
    2, "metrics", metrics_pb.ExportMetricsServiceRequest, metrics_pb.ExportMetricsServiceResponse,
    metrics_pb.ExportMetricsPartialSuccess, "rejected_data_points", decode_metrics,
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", "/v1/metrics",
    c.TS_NS, "received_data_points",
)
LOGS = Signal(
    3, "logs", logs_pb.ExportLogsServiceRequest, logs_pb.ExportLogsServiceResponse,
    logs_pb.ExportLogsPartialSuccess, "rejected_log_records", decode_logs,
    "/opentelemetry.proto.collector.logs.v1.LogsService/Export", "/v1/logs",
    c.TS_NS, "received_log_records",
)
SIGNALS = (SPANS, METRICS, LOGS)
BY_CODE = {s.code: s for s in SIGNALS}
BY_METHOD = {s.grpc_method: s for s in SIGNALS}
BY_PATH = {s.http_path: s for s in SIGNALS}
#: Arrow types of the contract's dtype names, as Polars' ``to_arrow`` gives them (tested), so
#: the collector writes the raw tables without importing Polars.
_ARROW_TYPES = {t.I64: pa.int64(), t.F64: pa.float64(), t.STR: pa.large_string(),
                t.BOOL: pa.bool_()}


def arrow_type(dtype: str) -> pa.DataType:
    """The Arrow type of a dtype name of the contract (``tables.I64``, ``list_of(...)``)."""
    for inner, arrow in _ARROW_TYPES.items():
        if dtype == t.list_of(inner):
            return pa.large_list(arrow)
    return _ARROW_TYPES[dtype]


def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of a contract table: its required columns in order."""
    return pa.schema([(name, arrow_type(d)) for name, d in t.table(table).dtypes.items()])


_ARROW = {s.folder: arrow_schema(t.RAW_SIGNALS[s.folder]) for s in SIGNALS}
