"""One scenario end to end: simulator -> a real collector -> pipeline -> analytics.

Shared by ``bench/accuracy.py`` (fixed suites) and ``bench/accuracy_random.py`` (random
fleets), which import it from here so that neither imports the other back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.runner import run as run_analytics
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.storage import DataDir
from fleetlens.simulator import parse_scenario
from fleetlens.simulator import run as simulate


def run_end_to_end(doc: dict, workdir: Path, config: AnalyticsConfig | None = None,
                   probe: Callable | None = None) -> tuple[dict, object, dict]:
    """Simulate ``doc`` into a real collector, run the pipeline and analytics (``probe``:
    passed to the simulator, see :mod:`simulator.control`).

    Returns (ground truth, analytics RunResult, timings in seconds).
    """
    data = DataDir(workdir / "data")
    timings = {}
    started = time.perf_counter()
    # Simulated time starts in January; accept timestamps that far from now.
    with running_collector(data.root, config={"max_clock_skew_s": 400 * 86400.0}) as collector:
        result = simulate(parse_scenario(doc), endpoint=collector.grpc_address, probe=probe)
    timings["simulate+collect"] = time.perf_counter() - started
    if result.exported.spans_failed or result.exported.points_failed:
        raise RuntimeError(f"the collector refused telemetry: {result.exported}")
    started = time.perf_counter()
    Pipeline(data, PipelineConfig()).run_once(full=True)
    timings["pipeline"] = time.perf_counter() - started
    started = time.perf_counter()
    analysed = run_analytics(data, config or AnalyticsConfig(), notify=False)
    timings["analytics"] = time.perf_counter() - started
    return result.ground_truth, analysed, timings
