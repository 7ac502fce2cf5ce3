"""Trace replay: the Azure CSV keeps every request's tokens and arrival offset; Mooncake
JSONL keeps lengths and shares KV blocks through its hash ids."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator import ScenarioError, parse_scenario
from fleetlens.simulator.arrivals import Stream
from tests.conftest import shared_file
from tests.simulator.helpers import simulate

AZURE = ("data", "azure_llm_2023", "AzureLLMInferenceTrace_code.csv")
START = "2026-01-05T14:00:00Z"
START_NS = int(datetime(2026, 1, 5, 14, tzinfo=UTC).timestamp()) * 1_000_000_000


def replay_doc(path: Path, fmt: str, duration: float, **fleet) -> dict:
    return {
        "fleet": {"name": "replay", "start": START, "duration_s": duration, "drain_s": 300,
                  "seed": 5, "hosts": [{"prefix": "h", "count": 2, "gpus": 4}], **fleet},
        "deployment": [{"service": "code", "model": "llama-3.1-8b"}],
        "workload": [{"service": "code", "replay": str(path), "format": fmt}],
    }


def azure_rows() -> list[tuple[int, int, int]]:
    """(offset ns from the first row, context tokens, generated tokens), parsed by hand."""
    rows = []
    with open(shared_file(*AZURE), newline="") as handle:
        for row in csv.DictReader(handle):
            day, clock = row["TIMESTAMP"].split(" ")
            hms, frac = clock.split(".")
            h, m, s = (int(x) for x in hms.split(":"))
            ns = ((int(day[-2:]) * 24 + h) * 3600 + m * 60 + s) * 10**9 + int(frac) * 100
            rows.append((ns, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    first = min(ns for ns, _, _ in rows)
    return sorted((ns - first, p, g) for ns, p, g in rows)


@pytest.mark.slow
def test_azure_replay_keeps_tokens_and_arrival_offsets() -> None:
    expected = azure_rows()
    assert len(expected) == 8819
    out = simulate(replay_doc(shared_file(*AZURE), "azure", duration=3500))
    got = sorted((s.start_time - START_NS, s.attributes[a.GEN_AI_PROMPT_TOKENS],
                  s.attributes[a.GEN_AI_COMPLETION_TOKENS]) for s in out.requests())
    assert got == expected
    assert out.result.rejected == 0 and out.result.unfinished == 0


def test_azure_replay_stops_at_the_duration() -> None:
    stream = Stream(parse_scenario(replay_doc(shared_file(*AZURE), "azure", 60)).workloads[0], 0, 1,
                    START_NS, 60.0, Path("."))
    requests = stream.until(0, 1000)
    assert requests and all(r.client_ns - START_NS < 60 * 10**9 for r in requests)
    assert len(requests) == sum(1 for ns, _, _ in azure_rows() if ns < 60 * 10**9)


def test_mooncake_replay_shares_prefix_blocks(tmp_path: Path) -> None:
    trace = tmp_path / "mooncake.jsonl"
    lines = [{"timestamp": 100 * i, "input_length": 1500, "output_length": 20,
              "hash_ids": [1, 2, 100 + i]} for i in range(200)]
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = simulate(replay_doc(trace, "mooncake", duration=30))
    spans = out.requests()
    assert sorted(s.attributes[a.GEN_AI_PROMPT_TOKENS] for s in spans) == [1500] * 200
    assert {s.attributes[a.GEN_AI_COMPLETION_TOKENS] for s in spans} == {20}
    hits = sum(v for _, v in out.series(a.ENGINE_PREFIX_CACHE_HITS)[-8:])
    queries = sum(v for _, v in out.series(a.ENGINE_PREFIX_CACHE_QUERIES)[-8:])
    # two shared 512-token blocks of 1,500: about 2/3 of the prompt tokens hit once warm
    assert 0.5 < hits / queries < 0.7


def test_a_bad_trace_row_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,x,3\n")
    with pytest.raises(ScenarioError, match="bad.csv:2"):
        simulate(replay_doc(trace, "azure", duration=10))


def test_the_scenario_hash_covers_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,3\n")
    before = parse_scenario(replay_doc(trace, "azure", 10)).sha256
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,11,3\n")
    assert parse_scenario(replay_doc(trace, "azure", 10)).sha256 != before
