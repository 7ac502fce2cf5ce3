"""A virtual vLLM-like fleet that emits real OTLP telemetry with injected incidents.

    from fleetlens.simulator import run
    result = run("simulator/scenarios/quick.toml", "127.0.0.1:4317", seed=7)
    result.ground_truth["incidents"]
"""

from fleetlens.simulator.run import Progress, RunResult, run
from fleetlens.simulator.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = [
    "Progress",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
    "run",
]
