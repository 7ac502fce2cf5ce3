"""The request view and the wire walker of ``bench/ingest_columnar.py`` (a prototype).

``ScopeView``: ExportTraceServiceRequest with ``ScopeSpans.spans`` as ``repeated bytes`` (the
OTLP trace schema copied under another package, as ``collector/lite_spans.py`` does), so each
span is its encoded bytes. :func:`span_fields` walks one span's top-level fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.trace.v1 import trace_pb2

_PACKAGE = "fleetlens.bench.scopeview.v1"


def _view_class() -> Any:
    proto = descriptor_pb2.FileDescriptorProto.FromString(trace_pb2.DESCRIPTOR.serialized_pb)
    old = "." + proto.package + "."
    proto.name, proto.package = "fleetlens/bench_scope_view.proto", _PACKAGE
    proto.ClearField("options")
    for message in proto.message_type:
        for fld in message.field:
            if fld.type_name.startswith(old):
                fld.type_name = f".{_PACKAGE}.{fld.type_name[len(old):]}"
    scope = next(m for m in proto.message_type if m.name == "ScopeSpans")
    spans = next(f for f in scope.field if f.name == "spans")
    spans.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    spans.ClearField("type_name")
    request = proto.message_type.add(name="ExportTraceServiceRequest")
    request.field.add(name="resource_spans", number=1,
                      type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                      type_name=f".{_PACKAGE}.ResourceSpans")
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(proto.name)
    except KeyError:
        pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{_PACKAGE}.ExportTraceServiceRequest"))


ScopeView = _view_class()


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def span_fields(buf: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """``(tag, head, value)`` of each top-level field: head is the tag and any length."""
    pos = 0
    while pos < len(buf):
        tag, after_tag = _varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            size, start = _varint(buf, after_tag)
            yield tag, buf[pos:start], buf[start:start + size]
            pos = start + size
        elif wire == 0:
            _, end = _varint(buf, after_tag)
            yield tag, buf[pos:after_tag], buf[after_tag:end]
            pos = end
        elif wire in (1, 5):
            end = after_tag + (8 if wire == 1 else 4)
            yield tag, buf[pos:after_tag], buf[after_tag:end]
            pos = end
        else:
            raise ValueError(f"wire type {wire}")
