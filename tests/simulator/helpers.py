"""Run scenarios in memory and read back spans and metric points."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator import parse_scenario, run
from tests.simulator.conftest import MemoryMetricExporter


@dataclass
class Outcome:
    """Spans and points of one in-memory run."""

    result: object
    spans: list  # ReadableSpan
    points: list  # (host, metric, attributes, value, ts_ns)

    def requests(self) -> list:
        return [s for s in self.spans if s.name == a.VLLM_REQUEST_SPAN]

    def series(self, metric: str, **attrs) -> list[tuple[int, float]]:
        return sorted((ts, v) for host, name, at, v, ts in self.points
                      if name == metric and all(at.get(k) == w or (k == "host" and host == w)
                                                for k, w in attrs.items()))


def simulate(doc: dict, seed: int | None = None) -> Outcome:
    """Run a scenario document with in-memory exporters."""
    spans, metrics = InMemorySpanExporter(), MemoryMetricExporter()
    result = run(parse_scenario(doc), exporters=(spans, metrics), seed=seed)
    return Outcome(result, list(spans.get_finished_spans()), metrics.points())


def host_of(span) -> str:
    return span.resource.attributes[a.HOST_NAME]


def tpot(span) -> float:
    out = span.attributes[a.GEN_AI_COMPLETION_TOKENS]
    return span.attributes[a.GEN_AI_DECODE] / max(out - 1, 1)
