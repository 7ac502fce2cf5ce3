"""fleetlens: trace ingestion and latency-spike analytics for LLM inference fleets.

This package is the command line and the one place that may import every component.
"""

__version__ = "0.1.0"
