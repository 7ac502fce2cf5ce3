"""The fleetlens host agent: NVML GPU sampling and vLLM ``/metrics`` scraping, exported as
OTLP metrics through the OpenTelemetry SDK (``fleetlens agent``; see docs/telemetry.md)."""
