"""One output flag everywhere: every listing command takes --format table|json|csv, explain
takes json too, and the three formats carry the same rows."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.runner import run
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir
from tests.analytics.synthetic import FleetSpec, Injected, generate
from tests.analytics.synthetic_io import write_tables

H = 3600


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    data = DataDir(tmp_path_factory.mktemp("formats") / "data")
    write_tables(generate(FleetSpec(hosts=3, gpus_per_host=2, duration_s=3 * H, seed=3), [
        Injected("kv_cache_pressure", "host_name=h01", 2 * H, 900)]), data)
    run(data, AnalyticsConfig(), notify=False)
    return str(data.root)


def invoke(*args: str) -> str:
    out = CliRunner().invoke(cli, list(args))
    assert out.exit_code == 0, out.output
    return out.stdout


@pytest.mark.parametrize("command", ["incidents", "baselines", "leaderboard"])
def test_listing_commands_print_the_same_rows_as_json_and_csv(root: str, command: str) -> None:
    as_json = json.loads(invoke(command, "--data-dir", root, "--format", "json"))
    rows = as_json["leaderboard"] if command == "leaderboard" else as_json
    as_csv = list(csv.DictReader(io.StringIO(invoke(command, "--data-dir", root,
                                                    "--format", "csv"))))
    assert rows and len(as_csv) == len(rows)
    assert list(as_csv[0]) == list(rows[0])  # same columns, same order
    key = next(k for k in rows[0] if isinstance(rows[0][k], str) and rows[0][k])
    assert [r[key] for r in as_csv] == [r[key] for r in rows]
    assert invoke(command, "--data-dir", root).strip()  # the table still prints


def test_explain_as_json_holds_the_ranked_causes_and_evidence(root: str) -> None:
    incidents = json.loads(invoke("incidents", "--data-dir", root, "--format", "json"))
    ident = incidents[0][c.INCIDENT_ID]
    report = json.loads(invoke("explain", ident, "--data-dir", root, "--format", "json"))
    assert report["incident"][c.INCIDENT_ID] == ident
    assert [cause[c.RANK] for cause in report["causes"]] == sorted(
        cause[c.RANK] for cause in report["causes"])
    assert isinstance(report["causes"][0][c.EVIDENCE], dict)  # parsed, not a JSON string
    assert report["series"] and report["slowest_requests"]
    assert report["causes"][0][c.CAUSE] == incidents[0][c.CAUSE]


def test_an_unknown_format_is_a_usage_error(root: str) -> None:
    out = CliRunner().invoke(cli, ["incidents", "--data-dir", root, "--format", "xml"])
    assert out.exit_code == 2 and "table" in out.output and "csv" in out.output


def test_the_leaderboard_ranks_steady_requests_like_the_dashboard(root: str) -> None:
    import polars as pl

    from fleetlens.analytics.leaderboard import outside_incidents
    from fleetlens.analytics.runner import read_table
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import scan

    data = DataDir(root)
    requests = scan(data, t.REQUESTS).collect()
    newest = scan(data, t.WINDOWS).select(pl.col(c.WINDOW_START_NS).max()).collect().item()
    steady = outside_incidents(requests.filter(pl.col(c.ARRIVAL_NS) < newest),
                               read_table(data, t.INCIDENTS))
    assert 0 < steady.height < requests.height  # the injected incident's requests are out
    ranked = json.loads(invoke("leaderboard", "--data-dir", root, "--format", "json"))
    assert sum(row[c.REQUESTS] for row in ranked["leaderboard"]) == steady.height
    everything = json.loads(invoke("leaderboard", "--data-dir", root, "--format", "json",
                                   "--include-incidents"))
    assert sum(row[c.REQUESTS] for row in everything["leaderboard"]) == requests.height
