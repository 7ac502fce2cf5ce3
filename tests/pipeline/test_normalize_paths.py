"""The shortcuts in ``normalize``: each must give what its exact path gives."""

from __future__ import annotations

import polars as pl
from polars.testing import assert_frame_equal

from fleetlens.pipeline.normalize import dedup_spans, normalize
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from tests.pipeline.rawdata import NS, T0, span, spans_frame, vllm_span

NO_MODELS = pl.DataFrame(schema={c.INSTANCE_ID: pl.String, c.MODEL: pl.String})


def _exact(spans: pl.DataFrame) -> pl.DataFrame:
    return spans.unique([c.TRACE_ID, c.SPAN_ID], keep="first", maintain_order=True)


def test_dedup_without_duplicates_is_the_exact_unique() -> None:
    spans = spans_frame([vllm_span(k, start_ns=T0 + k) for k in range(50)])
    assert_frame_equal(dedup_spans(spans), _exact(spans))
    # same span id in another trace, same trace id with another span id: not duplicates
    twins = spans_frame([span(1, 1, "x", start_ns=T0, end_ns=T0 + NS),
                         span(2, 1, "x", start_ns=T0, end_ns=T0 + NS),
                         span(1, 2, "x", start_ns=T0, end_ns=T0 + NS)])
    assert dedup_spans(twins).height == 3


def test_dedup_with_duplicates_keeps_the_first_copy_in_order() -> None:
    rows = [vllm_span(k, start_ns=T0 + k) for k in range(5)]
    late_copy = vllm_span(2, start_ns=T0 + 2, received_ns=T0 + 99 * NS)
    spans = spans_frame([*rows, late_copy, rows[0]])
    out = dedup_spans(spans)
    assert_frame_equal(out, _exact(spans))
    assert out.height == 5 and out[c.RECEIVED_NS][2] == rows[2][c.RECEIVED_NS]


def test_a_parent_id_reused_in_another_trace_removes_nothing() -> None:
    # trace 7's server span has parent 0x1; trace 8 has an unrelated request span with id 0x1:
    # the shortcut sees a match on span id alone and runs the exact (trace, span) anti-join.
    attrs = {a.GEN_AI_OPERATION_NAME: "chat", a.GEN_AI_INPUT_TOKENS: 3}
    server = span(7, 2, "chat", start_ns=T0, end_ns=T0 + NS, kind=2, parent=f"{1:016x}",
                  attrs=attrs)
    other = span(8, 1, "chat", start_ns=T0, end_ns=T0 + NS, kind=3, attrs=attrs)
    out = normalize(spans_frame([server, other]), NO_MODELS, {})
    assert sorted(out[c.TRACE_ID].to_list()) == [f"{7:032x}", f"{8:032x}"]
