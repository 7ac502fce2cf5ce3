"""The fleetlens collector: OTLP receivers, write-ahead log and raw Parquet segments."""
