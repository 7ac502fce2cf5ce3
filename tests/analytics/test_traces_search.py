"""``fleetlens traces``: the search finds the same requests a Polars filter of the stored
``requests`` finds, for every kind of filter; sorts and pages without gaps or repeats; and
answers a bad filter with one line (issue 35 item 1).

Data: the pipeline's small synthetic fleet (tests/pipeline/fleet.py) through the real
pipeline, so spans carry real attribute JSON, promoted gen_ai.* columns and resource
attributes, and ``instance_gpus`` comes from the agent's mapping gauge.
"""

from __future__ import annotations

import csv
import io
import json

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.cli import cli
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.runner import Pipeline
    from tests.pipeline.fleet import make_fleet, write_batches

    data = DataDir(tmp_path_factory.mktemp("traces") / "data")
    write_batches(data, make_fleet())
    Pipeline(data, PipelineConfig()).run_once()
    return str(data.root)


@pytest.fixture(scope="module")
def requests(root: str) -> pl.DataFrame:
    return scan(DataDir(root), t.REQUESTS).collect()


def run(root: str, *args: str) -> tuple[list[dict], str]:
    """``fleetlens traces`` as JSON: (rows, the page note it wrote to stderr)."""
    out = CliRunner().invoke(cli, ["traces", "--data-dir", root, "--format", "json",
                                   "--limit", "10000", *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout), out.stderr


def ids(rows: list[dict]) -> set[str]:
    return {r[c.REQUEST_ID] for r in rows}


def test_dimension_time_and_range_filters_select_what_polars_selects(
        root: str, requests: pl.DataFrame) -> None:
    t0 = int(requests[c.ARRIVAL_NS].min()) + 120 * 10**9
    t1 = t0 + 300 * 10**9
    expected = requests.filter(
        (pl.col(c.HOST_NAME) == "h1") & (pl.col(c.E2E_S) >= 0.5) & (pl.col(c.E2E_S) <= 2.45)
        & pl.col(c.ARRIVAL_NS).is_between(t0, t1, closed="left"))
    assert 5 < expected.height < requests.height / 4  # a real selection, not all or none
    rows, note = run(root, "--host", "h1", "--min", f"{c.E2E_S}=0.5",
                     "--max", f"{c.E2E_S}=2.45", "--since", str(t0), "--until", str(t1))
    assert ids(rows) == set(expected[c.REQUEST_ID])
    assert f"of {expected.height}" in note


def test_instance_errors_and_finish_reason(root: str, requests: pl.DataFrame) -> None:
    rows, _ = run(root, "--instance", "h0-i1", "--errors")
    expected = requests.filter((pl.col(c.INSTANCE_ID) == "h0-i1") & pl.col(c.IS_ERROR))
    assert expected.height and ids(rows) == set(expected[c.REQUEST_ID])
    rows, _ = run(root, "--no-errors", "--finish-reason", "stop", "--service", "chat")
    assert ids(rows) == set(requests.filter(~pl.col(c.IS_ERROR))[c.REQUEST_ID])
    assert run(root, "--finish-reason", "length")[0] == []


def test_a_gpu_selects_the_requests_of_the_instances_that_ran_on_it(
        root: str, requests: pl.DataFrame) -> None:
    rows, _ = run(root, "--gpu", "GPU-0-1")
    expected = requests.filter(pl.col(c.INSTANCE_ID) == "h0-i1")
    assert expected.height and ids(rows) == set(expected[c.REQUEST_ID])
    assert run(root, "--gpu", "GPU-1-0")[0] == []  # host h1 reported no mapping


@pytest.mark.parametrize("attr,expect", [
    # promoted to a typed column by the collector
    (f"{a.GEN_AI_PROMPT_TOKENS}>=390", pl.col(c.INPUT_TOKENS) >= 390),
    (f"{a.GEN_AI_PROMPT_TOKENS}<10", pl.col(c.INPUT_TOKENS) < 10),
    (f"{a.GEN_AI_PROMPT_TOKENS}=100", pl.col(c.INPUT_TOKENS) == 100),
    # in the span's attribute JSON: an int matched by 1 and by 1.0
    ("gen_ai.request.n=1", pl.lit(True)),
    ("gen_ai.request.n=1.0", pl.lit(True)),
    ("gen_ai.request.n!=1", pl.lit(False)),
    ("gen_ai.request.n", pl.lit(True)),
    ("no.such.key", pl.lit(False)),
    # in the resource's attributes
    (f"{a.SERVICE_INSTANCE_ID}=h0-i1", pl.col(c.INSTANCE_ID) == "h0-i1"),
    ("region=eu", pl.lit(True)),
    ("region=us", pl.lit(False)),
])
def test_attribute_filters(root: str, requests: pl.DataFrame, attr: str,
                           expect: pl.Expr) -> None:
    rows, _ = run(root, "--attr", attr)
    assert ids(rows) == set(requests.filter(expect)[c.REQUEST_ID])


def test_several_attributes_hold_on_one_span(root: str, requests: pl.DataFrame) -> None:
    rows, _ = run(root, "--attr", f"{a.GEN_AI_PROMPT_TOKENS}>200",
                  "--attr", f"{a.SERVICE_INSTANCE_ID}=h1-i0")
    expected = requests.filter((pl.col(c.INPUT_TOKENS) > 200)
                               & (pl.col(c.INSTANCE_ID) == "h1-i0"))
    assert expected.height and ids(rows) == set(expected[c.REQUEST_ID])


def test_pages_of_a_sort_are_the_sorted_table_cut_in_pieces(
        root: str, requests: pl.DataFrame) -> None:
    pages = []
    for offset in (0, 7, 14):
        rows, note = run(root, "--sort", f"-{c.E2E_S}", "--limit", "7",
                         "--offset", str(offset))
        pages += rows
        assert f"requests {offset + 1}-{offset + 7} of {requests.height}" in note
        assert f"--offset {offset + 7} for the next page" in note
    top = requests.sort([c.E2E_S, c.TRACE_ID], descending=[True, False]).head(21)
    assert [r[c.REQUEST_ID] for r in pages] == top[c.REQUEST_ID].to_list()
    rows, _ = run(root, "--sort", c.INPUT_TOKENS, "--limit", "5")
    assert [r[c.INPUT_TOKENS] for r in rows] == sorted(requests[c.INPUT_TOKENS])[:5]


def test_each_row_carries_its_phase_split(root: str) -> None:
    rows, _ = run(root, "--limit", "3", "--sort", f"-{c.E2E_S}")
    for row in rows:
        phases = row[c.QUEUE_S] + row[c.PREFILL_S] + row[c.DECODE_S] + row[c.OVERHEAD_S]
        assert phases == pytest.approx(row[c.E2E_S])
        assert c.DATE not in row and c.HOUR not in row  # partition folders are no columns


def test_csv_and_table_show_the_same_page(root: str) -> None:
    args = ["traces", "--data-dir", root, "--sort", f"-{c.E2E_S}", "--limit", "4"]
    as_csv = CliRunner().invoke(cli, [*args, "--format", "csv"])
    table = CliRunner(env={"COLUMNS": "200"}).invoke(cli, args)
    assert as_csv.exit_code == 0 and table.exit_code == 0, as_csv.output + table.output
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert len(rows) == 4
    for row in rows:
        assert row[c.TRACE_ID] in table.stdout
    for header in ("queue", "prefill", "decode", "other", "e2e ms"):
        assert header in table.stdout
    assert "--offset 4 for the next page" in table.stdout


def test_a_value_with_quotes_is_data_not_sql(root: str) -> None:
    assert run(root, "--service", "o'brien; drop table requests--",
               "--attr", "k='); select 1; --")[0] == []
    assert run(root, "--limit", "1")[0]  # the table is still there


@pytest.mark.parametrize("args,message", [
    (["--min", "nope=1"], "--min/--max nope: not a numeric column of requests"),
    (["--min", f"{c.SERVICE_NAME}=1"], "not a numeric column"),
    (["--min", f"{c.E2E_S}=fast"], "'fast' is not a number"),
    (["--max", f"{c.E2E_S}"], "expected COLUMN=NUMBER"),
    (["--min", f"{c.E2E_S}=3", "--max", f"{c.E2E_S}=1"], "nothing can match"),
    (["--attr", "x>abc"], "'abc' is not a number"),
    (["--attr", "=3"], "expected KEY"),
    (["--sort", "-nope"], "--sort nope: not a column of requests"),
    (["--since", "yesterday-ish"], "yesterday-ish"),
    (["--since", "1790003000", "--until", "1790002000"], "the time range is empty"),
    (["--device", "x"], "No such option"),
])
def test_a_bad_filter_is_one_clear_line(root: str, args: list[str], message: str) -> None:
    out = CliRunner().invoke(cli, ["traces", "--data-dir", root, *args])
    assert out.exit_code != 0
    assert message in out.output
    assert "Traceback" not in out.output
    if "No such option" not in message:
        assert out.output.strip().count("\n") == 0, out.output  # one line


def test_pages_of_a_sort_with_many_ties_neither_skip_nor_repeat(
        root: str, requests: pl.DataFrame) -> None:
    # output_tokens takes five values here: hundreds of rows tie on each
    args = ("--instance", "h0-i1", "--sort", f"-{c.OUTPUT_TOKENS}")
    whole, _ = run(root, *args)
    pages: list[dict] = []
    for offset in range(0, len(whole), 97):
        pages += run(root, *args, "--limit", "97", "--offset", str(offset))[0]
    assert [r[c.REQUEST_ID] for r in pages] == [r[c.REQUEST_ID] for r in whole]
    assert len(ids(pages)) == len(pages) == requests.filter(
        pl.col(c.INSTANCE_ID) == "h0-i1").height
    tokens = [r[c.OUTPUT_TOKENS] for r in pages]
    assert tokens == sorted(tokens, reverse=True)


def test_a_span_name_alone_or_with_attributes_on_the_same_span(
        root: str, requests: pl.DataFrame) -> None:
    assert ids(run(root, "--span-name", a.VLLM_REQUEST_SPAN)[0]) == set(requests[c.REQUEST_ID])
    assert run(root, "--span-name", "POST /v1/chat")[0] == []
    rows, _ = run(root, "--span-name", "nope", "--span-name", a.VLLM_REQUEST_SPAN,
                  "--attr", f"{a.GEN_AI_PROMPT_TOKENS}>=390")
    assert ids(rows) == set(requests.filter(pl.col(c.INPUT_TOKENS) >= 390)[c.REQUEST_ID])
    assert run(root, "--span-name", "nope", "--attr", f"{a.GEN_AI_PROMPT_TOKENS}>=390")[0] == []
