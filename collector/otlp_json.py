"""OTLP/JSON: the protobuf JSON mapping with hex trace and span ids (OTLP spec, "JSON").

``json_format`` would read ``traceId``/``spanId`` as base64; OTLP/JSON sends them as hex, so
ids are converted before parsing and after printing. Unknown fields are ignored, as the spec
requires of receivers.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format

from fleetlens.collector.errors import InvalidRequest
from fleetlens.collector.signals import Signal

#: JSON keys of bytes fields that OTLP/JSON encodes as hex.
ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def _hex_to_b64(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ID_KEYS and isinstance(value, str):
                node[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            elif isinstance(value, dict | list):
                _hex_to_b64(value)
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, dict | list):
                _hex_to_b64(item)
    return node


def _b64_to_hex(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            elif isinstance(value, dict | list):
                _b64_to_hex(value)
    elif isinstance(node, list):
        for item in node:
            _b64_to_hex(item)
    return node


def parse_json(signal: Signal, body: bytes, ingest: Any) -> Any:
    """Parse an OTLP/JSON Export body into the signal's request message.

    Raises:
        InvalidRequest: not JSON, not an object, bad hex ids, or wrong field types.
    """
    ingest.check_size(len(body))
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        _hex_to_b64(data)
        return json_format.ParseDict(data, signal.request(), ignore_unknown_fields=True)
    except Exception as exc:  # ValueError, ParseError, RecursionError, binascii.Error ...
        ingest.telemetry.add("invalid_requests")
        raise InvalidRequest(f"invalid OTLP/JSON {signal.folder} request: {exc}") from None


def to_json(message: Any) -> str:
    """A message in OTLP/JSON (camelCase names, hex ids)."""
    data = json_format.MessageToDict(message)
    return json.dumps(_b64_to_hex(data), separators=(",", ":"))
