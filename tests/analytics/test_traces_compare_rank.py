"""What the heatmap's comparison adds to attribution's score (issue 35's random-fleet misses):

- a prompt bucket that a TTFT band holds at any time is ranked after the instance that was
  slow in the selected span (before, the bucket came first: long prompts are slow always);
- values selecting the same requests (a host's only instance) are one difference;
- an instance on two GPUs names them (a request carries no GPU of such an instance).

Through ``analytics.traces.compare`` and ``fleetlens traces compare``."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.traces.compare import Selection, compare, compare_data_dir
from fleetlens.analytics.traces.query import TraceQuery
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.dashboard.synth import write_table

NS = 10**9
T0 = 1_789_999_200 * NS
SPAN = (T0 + 1200 * NS, T0 + 1800 * NS)
#: h1 runs two single-GPU instances, h2 two, h3 one instance on two GPUs (the slow one)
INSTANCES = {"h1-i0": ("h1", ("GPU-a",)), "h1-i1": ("h1", ("GPU-b",)),
             "h2-i0": ("h2", ("GPU-c",)), "h2-i1": ("h2", ("GPU-d",)),
             "h3-i0": ("h3", ("GPU-e", "GPU-f"))}
SLOW = "h3-i0"


def fleet() -> pl.DataFrame:
    """One request a second per instance for an hour. 8% of prompts are long (8192+ tokens)
    and take 4 s to the first token, the rest 0.2-0.3 s; during the span the slow instance
    takes four times as long."""
    rng = np.random.default_rng(35)
    rows = []
    for n, (instance, (host, _)) in enumerate(INSTANCES.items()):
        for k in range(3600):
            arrival = T0 + k * NS + n
            long = rng.uniform() < 0.08
            ttft = 4.0 + rng.uniform(0, 0.5) if long else 0.2 + rng.uniform(0, 0.1)
            if instance == SLOW and SPAN[0] <= arrival < SPAN[1]:
                ttft *= 4
            rows.append({
                c.REQUEST_ID: f"r-{instance}-{k}", c.TRACE_ID: f"{instance}-{k:026x}",
                c.SPAN_ID: f"{k:016x}", c.SERVICE_NAME: "chat", c.MODEL: "m",
                c.HOST_NAME: host, c.INSTANCE_ID: instance, c.ARRIVAL_NS: arrival,
                c.END_NS: arrival + int((ttft + 1) * NS), c.TTFT_S: ttft, c.E2E_S: ttft + 1,
                c.TPOT_S: 0.01, c.INPUT_TOKENS: 9000 if long else int(rng.integers(10, 900)),
                c.OUTPUT_TOKENS: 100, c.CACHED_TOKENS: 0, c.IS_ERROR: False,
                c.FINISH_REASON: "stop"})
    return pl.DataFrame(rows)


def mapping() -> pl.DataFrame:
    return pl.DataFrame([{c.HOST_NAME: host, c.INSTANCE_ID: instance, c.MODEL: "m",
                          c.GPU_UUID: gpu, c.START_NS: T0, c.END_NS: T0 + 3600 * NS}
                         for instance, (host, gpus) in INSTANCES.items() for gpu in gpus])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    data = DataDir(tmp_path_factory.mktemp("compare-rank") / "data")
    write_table(data, t.REQUESTS, conform(fleet(), t.REQUESTS), c.ARRIVAL_NS)
    write_table(data, t.INSTANCE_GPUS, conform(mapping(), t.INSTANCE_GPUS), None)
    return data


def band() -> Selection:
    """The span x TTFT above the p90 of the requests outside it, as a user draws it."""
    frame = fleet()
    outside = frame.filter((pl.col(c.ARRIVAL_NS) < SPAN[0]) | (pl.col(c.ARRIVAL_NS) >= SPAN[1]))
    return Selection(c.TTFT_S, *SPAN, low=float(outside[c.TTFT_S].quantile(0.9)))


def test_the_prompt_bucket_of_the_band_at_any_time_comes_after_the_slow_instance() -> None:
    result = compare(fleet(), band())
    first = result.differences[0]
    assert (first.dimension, first.value) == (c.INSTANCE_ID, SLOW)
    assert not first.at_any_time and first.outside_share == pytest.approx(0.2, abs=0.05)
    bucket = next(d for d in result.differences if d.dimension == c.PROMPT_BUCKET)
    # the bucket still scores higher than the instance: only the band outside ranks it
    assert bucket.value == "8192-32768" and bucket.score > first.score
    assert bucket.at_any_time and bucket.outside_share > bucket.selected_share
    assert "as common in this band outside the span" in bucket.note()
    assert [d.at_any_time for d in result.differences] == sorted(
        d.at_any_time for d in result.differences)


def test_the_host_of_one_instance_is_the_same_difference_and_the_instance_names_its_gpus(
        root: DataDir) -> None:
    result = compare_data_dir(root, TraceQuery(), band())
    first = result.differences[0]
    assert (first.dimension, first.value) == (c.INSTANCE_ID, SLOW)
    assert first.same_as == (f"{c.HOST_NAME}=h3",)
    assert first.gpus == ("GPU-e", "GPU-f")
    named = [f"{d.dimension}={d.value}" for d in result.differences]
    assert f"{c.HOST_NAME}=h3" not in named  # not repeated on its own
    assert first.note() == "same requests as host_name=h3; on GPUs GPU-e GPU-f"


def test_without_time_outside_the_span_nothing_is_at_any_time() -> None:
    result = compare(fleet(), Selection(c.TTFT_S, T0, T0 + 3600 * NS, low=1.0))
    assert result.differences and all(d.outside_share is None for d in result.differences)
    assert not any(d.at_any_time for d in result.differences)


def test_the_cli_lists_the_same_requests_gpus_and_the_band_outside(root: DataDir) -> None:
    sel = band()
    args = ["traces", "compare", "--data-dir", str(root.root), "--metric", c.TTFT_S,
            "--from", str(sel.start_ns), "--to", str(sel.end_ns),
            "--min-latency", repr(sel.low)]
    out = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert (rows[0]["value"], rows[0]["same_as"], rows[0]["gpus"]) == (
        SLOW, [f"{c.HOST_NAME}=h3"], ["GPU-e", "GPU-f"])
    assert rows[0]["at_any_time"] is False
    bucket = next(r for r in rows if r["dimension"] == c.PROMPT_BUCKET)
    assert bucket["at_any_time"] is True and bucket["rank"] > 1
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == 0, table.output
    assert "GPU-e GPU-f" in table.output and "outside the span" in table.output
