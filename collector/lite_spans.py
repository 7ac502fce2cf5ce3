"""A second view of an ExportTraceServiceRequest whose span attributes stay raw bytes.

Reading 15 attributes through upb costs three wrapper objects each (KeyValue, AnyValue and the
oneof probe), about 0.5 us per attribute: half of a vLLM span's decode time. This module builds,
at import, a copy of the OTLP trace schema in which ``Span.attributes`` is ``repeated bytes``:
parsing the same request bytes with it yields each KeyValue as its encoded bytes, and
:func:`read_header` reads the common shape (key, one scalar value) with a few byte operations.

It is a view only: the request is still parsed with the real schema first, which validates
UTF-8, nesting and structure. Every KeyValue whose encoding is not the plain
``key, value{one scalar}`` shape is parsed with the real ``KeyValue`` type instead, so the
result is exactly what the real schema gives.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

_LITE_PACKAGE = "fleetlens.lite.trace.v1"
_ATTRIBUTES_FIELD = 9  # Span.attributes in opentelemetry/proto/trace/v1/trace.proto
#: AnyValue field tags (field number << 3 | wire type) read without upb.
TAG_STRING, TAG_BOOL, TAG_INT, TAG_DOUBLE = 0x0A, 0x10, 0x18, 0x21
#: Header shapes kept; a request rarely carries more than a few dozen distinct ones.
MAX_HEADERS = 4096

KeyValue = common_pb2.KeyValue


def _lite_request_class() -> Any:
    proto = descriptor_pb2.FileDescriptorProto.FromString(trace_pb2.DESCRIPTOR.serialized_pb)
    old = "." + proto.package + "."
    proto.name = "fleetlens/lite_trace.proto"
    proto.package = _LITE_PACKAGE
    proto.ClearField("options")

    def retarget(message: Any) -> None:
        for fld in message.field:
            if fld.type_name.startswith(old):
                fld.type_name = f".{_LITE_PACKAGE}.{fld.type_name[len(old):]}"
        for nested in message.nested_type:
            retarget(nested)

    for message in proto.message_type:
        retarget(message)
    span = next(m for m in proto.message_type if m.name == "Span")
    attributes = next(f for f in span.field if f.number == _ATTRIBUTES_FIELD)
    attributes.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    attributes.ClearField("type_name")
    request = proto.message_type.add(name="ExportTraceServiceRequest")
    request.field.add(
        name="resource_spans", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        type_name=f".{_LITE_PACKAGE}.ResourceSpans",
    )
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(proto.name)
    except KeyError:
        pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{_LITE_PACKAGE}.ExportTraceServiceRequest"))


#: ExportTraceServiceRequest with ``Span.attributes`` as ``repeated bytes``.
LiteRequest = _lite_request_class()


def read_header(kvb: bytes) -> tuple[str, int, int, int] | None:
    """The plain shape of an encoded KeyValue, or None when it has any other shape.

    Plain: ``0x0A klen key 0x12 vlen tag ...`` with one-byte lengths, the value holding exactly
    one scalar field. Returns ``(key, tag, offset of the scalar, total length)``; the caller
    still checks a varint's end and a string's length byte, which depend on the value.
    """
    if len(kvb) < 5 or kvb[0] != 0x0A or kvb[1] > 0x7F:
        return None
    end = 2 + kvb[1]
    if len(kvb) < end + 3 or kvb[end] != 0x12 or kvb[end + 1] > 0x7F:
        return None
    vlen, tag = kvb[end + 1], kvb[end + 2]
    total = end + 2 + vlen
    if len(kvb) != total:
        return None
    if tag == TAG_DOUBLE and vlen != 9 or tag == TAG_STRING and vlen < 2 \
            or tag in (TAG_INT, TAG_BOOL) and vlen < 2 \
            or tag not in (TAG_DOUBLE, TAG_STRING, TAG_INT, TAG_BOOL):
        return None
    return kvb[2:end].decode("utf-8"), tag, end + 3, total


def varint(kvb: bytes, offset: int) -> int | None:
    """The int64 varint from ``offset`` to the end of ``kvb``; None if it ends elsewhere."""
    value = shift = 0
    last = len(kvb) - 1
    for pos in range(offset, last + 1):
        byte = kvb[pos]
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if pos != last:
                return None
            value &= (1 << 64) - 1  # upb keeps the low 64 bits of a long varint
            return value - (1 << 64) if value >= 1 << 63 else value
    return None


def _lite_class(name: str) -> Any:
    return message_factory.GetMessageClass(
        descriptor_pool.Default().FindMessageTypeByName(f"{_LITE_PACKAGE}.{name}"))


#: The view's Span and ScopeSpans: what the span kernel (collector/span_kernel.py) hands
#: back to Python, one span or one scope's bytes at a time.
LiteSpan = _lite_class("Span")
LiteScopeSpans = _lite_class("ScopeSpans")
