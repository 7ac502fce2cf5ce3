"""fleetlens: trace ingestion and latency-spike analytics for LLM inference fleets.

This package is the command line and the one place that may import every component.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml is the one place the version is written.
    __version__ = version("fleetlens")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
