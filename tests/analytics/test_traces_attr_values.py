"""Attribute equality over the collector's stored JSON: a string value is first looked for
as JSON text (a substring test that spares parsing most spans), which must never hide a
value stored as a boolean or null, nor one in the resource's attributes."""

from __future__ import annotations

import pytest

from fleetlens.analytics.traces.query import TraceQuery, parse_attr
from fleetlens.analytics.traces.search import search_data_dir
from fleetlens.pipeline.storage import DataDir
from tests.analytics import traces_detail_data as k


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    root = DataDir(tmp_path_factory.mktemp("attr-values") / "data")
    k.build(root)
    return root


@pytest.mark.parametrize("attr,total", [
    ("retry=true", 1),          # a boolean: JSON true, no quotes
    ("retry=false", 0),
    ("http.route=/v1/chat", 1),  # on the gateway span, the request is the engine's
    ("user.tier=gold", 1),
    ("user.tier=silver", 0),
    ("region=eu-west", 1),      # the gateway's resource
    ("region!=eu-west", 0),
])
def test_equality_on_stored_values(root: DataDir, attr: str, total: int) -> None:
    result = search_data_dir(root, TraceQuery(attrs=(parse_attr(attr),)))
    assert result.total == total == result.rows.height
