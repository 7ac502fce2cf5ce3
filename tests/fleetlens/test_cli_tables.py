"""What the listing commands print for a person at a terminal: tables that fit its width,
the baselines that need a look first, an incident's slowest requests in visible order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.runner import publish
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic

NS = 1_000_000_000
START = 1_760_000_000 * NS
GPU = "GPU-c28a383c-33f3-7003-970c-63354820f1d9"  # a subject with no space to wrap at


def _incident(ident: str, metric: str, host: str, offset_min: int) -> dict:
    start = START + offset_min * 60 * NS
    return {c.INCIDENT_ID: ident, c.METRIC: metric, c.SERVICE_NAME: "chat-70b",
            c.MODEL: "meta-llama/Llama-3.1-70B-Instruct", c.HOST_NAME: host,
            c.START_NS: start, c.END_NS: start + 360 * NS, c.PEAK: 3.0, c.EXPECTED: 1.0,
            c.SEVERITY: "critical", c.DETECTOR: "rolling"}


@pytest.fixture
def root(tmp_path: Path) -> DataDir:
    """Two incidents with their top causes, three baselines, requests of the first one."""
    root = DataDir(tmp_path / "data")
    incidents = pl.DataFrame([_incident("7b11dafbf4ca1216", "ttft_p99_s", "h03", 0),
                              _incident("47e5ce2dfb388508", "tpot_p99_s", "h04", 30)])
    publish(root, t.INCIDENTS, incidents.cast(t.table(t.INCIDENTS).empty().schema), c.START_NS)
    causes = pl.DataFrame({
        c.INCIDENT_ID: ["7b11dafbf4ca1216", "47e5ce2dfb388508"], c.RANK: [1, 1],
        c.CAUSE: ["thermal_throttle", "kv_cache_pressure"], c.SUBJECT: [GPU, "host_name=h04"],
        c.SCORE: [1.0, 1.0], c.SHARE_OF_EXCESS: [0.9, 0.8],
        c.EVIDENCE: [json.dumps({})] * 2, c.SUMMARY: ["s", "s"], c.START_NS: [START] * 2})
    publish(root, t.CAUSES, causes, c.START_NS)
    series = ["ttft_p99_s{service_name=chat-70b,model=meta-llama/Llama-3.1-70B-Instruct,"
              f"host_name={h}}}" for h in ("h01", "h02", "h03")]
    baselines = pl.DataFrame({  # h01 in band, h02 a little above, h03 far below
        c.SERIES: series, c.METHOD: ["rolling"] * 3, c.TS_NS: [START] * 3,
        c.VALUE: [1.0, 2.2, 0.1], c.EXPECTED: [1.0] * 3, c.LOWER: [0.5] * 3,
        c.UPPER: [2.0] * 3})
    publish(root, t.BASELINES, baselines, c.TS_NS)
    # The longest TTFTs are the shortest requests: sorted by TTFT, e2e runs upwards.
    ttft, e2e = [0.9, 0.5, 0.7, 0.2], [1.0, 9.0, 4.0, 20.0]
    requests = pl.DataFrame({
        c.REQUEST_ID: [f"req-{i}" for i in range(4)], c.TRACE_ID: [f"{i:032x}" for i in range(4)],
        c.SERVICE_NAME: ["chat-70b"] * 4, c.MODEL: ["meta-llama/Llama-3.1-70B-Instruct"] * 4,
        c.HOST_NAME: ["h03"] * 4, c.ARRIVAL_NS: [START + i * NS for i in range(4)],
        c.TTFT_S: ttft, c.E2E_S: e2e, c.QUEUE_S: [0.0] * 4, c.PREFILL_S: ttft,
        c.DECODE_S: [e - f for e, f in zip(e2e, ttft, strict=True)],
        c.INPUT_TOKENS: [100] * 4, c.OUTPUT_TOKENS: [10] * 4})
    write_parquet_atomic(requests, root.table_dir(t.REQUESTS) / "requests.parquet")
    return root


def invoke(*args: str, columns: int = 80) -> str:
    out = CliRunner().invoke(cli, list(args), env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    return out.output


@pytest.mark.parametrize("columns", [80, 120])
def test_incidents_fit_the_terminal_with_whole_ids(root: DataDir, columns: int) -> None:
    out = invoke("incidents", "--data-dir", str(root.root), "--no-refresh", columns=columns)
    assert max(len(line) for line in out.splitlines()) <= columns, out
    # an id is copied into `explain`: never wrapped nor cut
    assert re.search(r"^7b11dafbf4ca1216 ", out, re.MULTILINE), out
    assert re.search(r"^47e5ce2dfb388508 ", out, re.MULTILINE), out
    assert "thermal_thr" in out  # folded at a narrow width, never dropped
    assert "kv_cache" in out


def test_baselines_show_the_series_out_of_band_first_and_the_rest_with_all(
        root: DataDir) -> None:
    out = invoke("baselines", "--data-dir", str(root.root), columns=200)
    assert "host_name=h03" in out and "host_name=h02" in out and "host_name=h01" not in out
    # farthest out first: h03 is 0.4 band widths below, h02 0.13 above
    assert out.index("host_name=h03") < out.index("host_name=h02")
    assert "BELOW" in out and "ABOVE" in out
    assert "2 of 3 series out of their band" in out and "--all" in out
    everything = invoke("baselines", "--data-dir", str(root.root), "--all", columns=200)
    assert everything.index("host_name=h02") < everything.index("host_name=h01")
    assert "in band" in everything
    narrow = invoke("baselines", "--data-dir", str(root.root), "--all", columns=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80, narrow


def test_explain_lists_the_slowest_requests_by_what_they_are_sorted_on(root: DataDir) -> None:
    out = invoke("explain", "7b11dafbf4ca1216", "--data-dir", str(root.root), columns=200)
    section = out.split("Slowest requests", 1)[1].split("\n\n", 1)[0].splitlines()
    assert "by ttft" in section[0], section
    shown = [float(re.match(r"\s+ttft (\S+) s: ", line).group(1))  # type: ignore[union-attr]
             for line in section[1:]]
    assert shown == sorted(shown, reverse=True) == [0.9, 0.7, 0.5, 0.2], section


def test_a_leaderboard_too_wide_for_the_terminal_is_a_block_per_row(tmp_path: Path) -> None:
    """Thirteen columns do not fit 80: each configuration is a block of whole values, not a
    table of cells cut to a letter and a dot; a wide terminal still gets the table."""
    from tests.analytics.synthetic import FleetSpec, generate
    from tests.analytics.synthetic_io import write_tables

    data = DataDir(tmp_path / "data")
    write_tables(generate(FleetSpec(hosts=2, gpus_per_host=1, duration_s=3600, seed=3), []),
                 data)
    models = pl.read_parquet(list(data.table_dir(t.REQUESTS).rglob("*.parquet")))[c.MODEL]
    args = ("leaderboard", "--data-dir", str(data.root), "--samples", "10")
    narrow = invoke(*args, columns=80)
    table_part = narrow.split("best under SLA")[0].split("no configuration meets")[0]
    assert max(len(line) for line in table_part.splitlines()) <= 80, narrow
    assert "…" not in narrow, narrow
    for model in models.unique():
        assert f"model: {model}" in narrow, narrow
    assert "tok/s/GPU: " in narrow and "J/token: " in narrow
    wide = invoke(*args, columns=250)
    assert "model: " not in wide and "tok/s/GPU" in wide, wide
