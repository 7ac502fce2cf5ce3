"""Issue 33 #7: ``gen_ai.request.model`` has a cardinality budget like service and host names
(``max_names_per_window``, then ``__overflow__``), kept apart from theirs. A real collector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetlens.collector.decode_common import OVERFLOW_NAME
from fleetlens.collector.testing import running_collector, vllm_trace_request
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from tests.collector.test_forward import raw_rows, wait_until

pytestmark = [pytest.mark.e2e]
BUDGET = 5


def _with_models(request: Any, models: list[str], service: str | None = None) -> Any:
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    for span, model in zip(spans, models, strict=True):
        for kv in span.attributes:
            if kv.key == a.GEN_AI_REQUEST_MODEL:
                kv.value.string_value = model
    if service is not None:
        for rs in request.resource_spans:
            for kv in rs.resource.attributes:
                if kv.key == a.SERVICE_NAME:
                    kv.value.string_value = service
    return request


def test_model_names_past_the_budget_share_the_overflow_bucket(tmp_path: Path) -> None:
    config = {"flush_interval_s": 0.3, "self_metrics_address": "",
              "max_names_per_window": BUDGET, "max_new_names_per_request": 1000}
    sent = 0
    with running_collector(tmp_path / "col", config=config) as col:
        for batch in range(3):  # 30 distinct model names
            models = [f"model-{batch}-{i}" for i in range(10)]
            col.export(_with_models(vllm_trace_request(10, seed=batch), models))
            sent += 10
        # A new service after the model flood still gets its own name.
        col.export(_with_models(vllm_trace_request(2, seed=9), ["model-0-0"] * 2, "late"))
        sent += 2
        columns = [c.GEN_AI_REQUEST_MODEL, c.SERVICE_NAME]
        wait_until(lambda: len(raw_rows(col.data_dir, "spans", columns)) == sent, 30,
                   "every span to be published")
        rows = raw_rows(col.data_dir, "spans", columns)
        models = {model for model, _ in rows}
        assert OVERFLOW_NAME in models and len(models - {OVERFLOW_NAME}) == BUDGET, models
        assert {service for _, service in rows} == {"vllm", "late"}
        assert "model-0-0" in models  # the first ones keep their names
