"""Raw telemetry to derived tables. ``pipeline.schema`` and ``pipeline.storage`` are leaves
that every other package may import; the rest of ``pipeline`` is the job code."""
