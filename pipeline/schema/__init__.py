"""The one package that owns every name fleetlens uses: tables, columns, attribute keys,
metric names, the cause vocabulary and the config-loading machinery.

It imports nothing of ours, so every other package may import it.

    from fleetlens.pipeline.schema import columns as c, tables as t, attributes as a
    validate(frame, t.REQUESTS)
"""

from fleetlens.pipeline.schema import attributes, columns, tables
from fleetlens.pipeline.schema.causes import CAUSES, FAILURE_CAUSES, LATENCY_CAUSES, Cause
from fleetlens.pipeline.schema.tables import FLEET_WIDE, RAW_SIGNALS, TABLES, Table, table
from fleetlens.pipeline.schema.validate import SchemaError, conform, validate

__all__ = [
    "CAUSES",
    "FAILURE_CAUSES",
    "FLEET_WIDE",
    "LATENCY_CAUSES",
    "RAW_SIGNALS",
    "TABLES",
    "Cause",
    "SchemaError",
    "Table",
    "attributes",
    "columns",
    "conform",
    "table",
    "tables",
    "validate",
]
