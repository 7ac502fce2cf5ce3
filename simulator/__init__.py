"""A virtual vLLM-like fleet that emits real OTLP telemetry with injected incidents."""
