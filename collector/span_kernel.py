"""The compiled span kernel (``collector/_spankernel.c``) and the Python path, side by side.

``decode_spans`` asks :func:`scopes` for a request's scopes; with the kernel each scope's
spans are decoded in C (about 1 us a span instead of 9), without it (not built, or
``FLEETLENS_SPAN_KERNEL=0``) :func:`scopes` answers None and the Python decoder runs as
before. The Python decoder stays the reference: the kernel hands back, by their bytes, the
spans it does not decode exactly as Python would (events, links, invalid ids or times,
attributes outside the plain one-scalar shape, non-canonical encodings), and they go through
``_span_row`` as ever; a request whose outer levels are not canonical goes the Python way whole.
So limits, truncation counts, rejections and their messages are the same either way
(``tests/collector/test_span_kernel.py`` checks it, on the fuzz corpus and random requests).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pyarrow as pa
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from fleetlens.collector.decode_common import ITEM_ERRORS, Limits, Outcome
from fleetlens.collector.lite_spans import LiteScopeSpans, LiteSpan

#: Set to 0 (or off/false/no) to run the Python decoder even where the kernel is built.
ENV = "FLEETLENS_SPAN_KERNEL"
_OFF = ("0", "off", "false", "no")


def _load() -> ModuleType | None:
    if os.environ.get(ENV, "1").strip().lower() in _OFF:
        return None
    try:
        from fleetlens.collector import _spankernel
    except ImportError:  # not built (no compiler at install): the Python decoder
        return None
    return _spankernel


#: The kernel module, or None for the Python path (tests switch it here).
KERNEL: ModuleType | None = _load()
#: Set by :func:`configure`: decode_spans' _span_row and _attributes_json.
_PYTHON: dict[str, Callable[..., Any]] = {}


def configure(promoted: tuple[tuple[bytes, int], ...], empty_object: str, empty_list: str,
              span_row: Callable[..., tuple], attributes_json: Callable[..., Any],
              mutable: tuple[int, ...] = ()) -> None:
    """Tell the kernel the promoted keys (in column order; kind 0 str, 1 float, 2 int) and
    the Python functions it defers to; ``mutable``: row columns the caller changes after
    decoding (they stay plain lists, an Arrow copy would go stale)."""
    _PYTHON.update(span_row=span_row, attributes_json=attributes_json)
    _MUTABLE.update(mutable)
    if KERNEL is not None:
        KERNEL.configure(promoted, empty_object, empty_list)


def _check_known(message: Any, size: int, limits: Limits) -> None:
    """What the Python path's whole-request check does, for one part the kernel skipped."""
    message.DiscardUnknownFields()
    if message.ByteSize() != size:
        limits.unknown_fields = True


class ArrowColumn(list):
    """A column as a list (what every reader sees) carrying the same values as Arrow arrays,
    built by the kernel from its buffers: pyarrow takes those as they are
    (``__arrow_array__``) instead of converting value by value (about 0.04 us a value).

    Only ever extended through :meth:`add`; extended by a plain list it drops its arrays,
    and should its length stop matching them, pyarrow converts the list as before.
    """

    __slots__ = ("chunks",)

    def __init__(self, values: list[Any], array: pa.Array) -> None:
        super().__init__(values)
        self.chunks: list[pa.Array] | None = [array]

    def add(self, values: list[Any]) -> None:
        """Append ``values`` (another scope's column)."""
        self.extend(values)
        if self.chunks is not None and isinstance(values, ArrowColumn) and values.chunks:
            self.chunks.extend(values.chunks)
        else:
            self.chunks = None

    def __arrow_array__(self, type: pa.DataType | None = None) -> pa.Array:  # noqa: A002
        chunks = self.chunks
        if chunks and sum(map(len, chunks)) == len(self) \
                and all(type is None or chunk.type == type for chunk in chunks):
            return chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
        return pa.array(list(self), type=type)


def extend(columns: dict[str, list[Any]], name: str, values: list[Any]) -> None:
    """Append one scope's ``values`` to ``columns[name]``, keeping the kernel's arrays."""
    current = columns[name]
    if isinstance(current, ArrowColumn):
        current.add(values)
    elif not current and isinstance(values, ArrowColumn):
        columns[name] = values
    else:
        current.extend(values)


#: Arrow types of the kernel's buffers, by the kind it gives them.
_ARROW_TYPES = (pa.int64(), pa.float64(), pa.large_string())
#: Row columns (their index) whose values are changed after decoding: never given arrays.
_MUTABLE: set[int] = set()


def _with_arrays(columns: tuple[list[Any], ...], buffers: tuple) -> list[list[Any]]:
    """The kernel's columns, each as an :class:`ArrowColumn` of its buffers."""
    out = list(columns)
    count = len(columns[0])
    for index, kind, data, offsets, validity, nulls in buffers:
        if index in _MUTABLE:
            continue
        parts = [None if validity is None else pa.py_buffer(validity)]
        if offsets is not None:
            parts.append(pa.py_buffer(offsets))
        parts.append(pa.py_buffer(data))
        array = pa.Array.from_buffers(_ARROW_TYPES[kind], count, parts, null_count=nulls)
        out[index] = ArrowColumn(columns[index], array)
    return out


class KernelScope:
    """One ScopeSpans of the request, its spans decoded by the kernel on demand."""

    def __init__(self, raw: bytes, offset: int, length: int, count: int) -> None:
        self.raw, self.offset, self.length, self.count = raw, offset, length, count

    def skip(self, limits: Limits) -> None:
        """The scope is rejected whole: only its unknown fields are looked for."""
        scope = LiteScopeSpans.FromString(self.raw[self.offset:self.offset + self.length])
        _check_known(scope, self.length, limits)

    def columns(self, limits: Limits, out: Outcome, index: int) -> list[list[Any]] | None:
        """The accepted spans' columns (None if none); rejected ones go to ``out``, numbered
        from ``index`` as in the request."""
        columns, fallbacks, truncated, buffers = KERNEL.decode_scope(  # type: ignore[union-attr]
            self.raw, self.offset, self.length, limits.earliest_ns, limits.latest_ns,
            limits.max_value_bytes, limits.max_name_bytes, _PYTHON["attributes_json"], limits)
        limits.truncated += truncated
        if not fallbacks:
            return _with_arrays(columns, buffers) if columns[0] else None
        # Rare: some spans are Python's. Rows in request order, then columns again.
        kernel_rows = iter(zip(*columns, strict=True))
        by_position = dict(fallbacks)
        span_row = _PYTHON["span_row"]
        rows = []
        for position in range(self.count):
            encoded = by_position.get(position)
            if encoded is None:
                rows.append(next(kernel_rows))
                continue
            span = LiteSpan.FromString(encoded)
            _check_known(span, len(encoded), limits)
            try:
                rows.append(span_row(span, limits))
            except ITEM_ERRORS as error:
                out.reject(f"span {index + position}", error)
        return [list(values) for values in zip(*rows, strict=True)] if rows else None


def scopes(raw: bytes, limits: Limits) -> list[tuple[Any, str, Any, str, KernelScope]] | None:
    """``(resource, resource schema_url, scope, scope schema_url, spans)`` of each ScopeSpans,
    in request order, or None: no kernel, or a request for the Python path."""
    if KERNEL is None:
        return None
    plan = KERNEL.walk(raw)
    if plan is None:
        return None
    out = []
    for resource_bytes, resource_url, scope_list in plan:
        resource = resource_pb2.Resource()
        if resource_bytes is not None:
            resource = resource_pb2.Resource.FromString(resource_bytes)
            _check_known(resource, len(resource_bytes), limits)
        for scope_bytes, scope_url, offset, length, count in scope_list:
            scope = common_pb2.InstrumentationScope()
            if scope_bytes is not None:
                scope = common_pb2.InstrumentationScope.FromString(scope_bytes)
                _check_known(scope, len(scope_bytes), limits)
            out.append((resource, resource_url, scope, scope_url,
                        KernelScope(raw, offset, length, count)))
    return out
