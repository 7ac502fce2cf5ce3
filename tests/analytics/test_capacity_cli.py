"""``fleetlens capacity`` through the command line, over a data directory holding a fleet whose
step-time physics is known: the analytics run writes the capacity tables, the command
prints them as a table, JSON and CSV."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from fleetlens.analytics.runner import read_table
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.capacity_ramp import Ramp, write_ramp

RAMP = Ramp(batches=tuple(np.linspace(1, 140, 40)))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    data = DataDir(tmp_path_factory.mktemp("capacity") / "data")
    write_ramp(RAMP, data)
    return str(data.root)


def invoke(*args: str) -> str:
    out = CliRunner().invoke(cli, list(args))
    assert out.exit_code == 0, out.output
    return out.stdout


def test_capacity_runs_the_analytics_and_prints_the_knee(root: str) -> None:
    rows = json.loads(invoke("capacity", "--data-dir", root, "--format", "json"))
    assert len(rows) == 1
    row = rows[0]
    assert row[c.SERVICE_NAME] == "chat" and row[c.TP] == 1
    assert row[c.KNEE_LIMIT] == "tpot"
    assert row[c.KNEE_BATCH] == pytest.approx(RAMP.knee(), rel=0.05)
    assert row[c.KNEE_RPS] == pytest.approx(RAMP.instances * RAMP.rps(RAMP.knee()), rel=0.05)
    # what the command printed is what the analytics run stored
    stored = read_table(DataDir(root), t.CAPACITY)
    assert stored.height == 1 and stored[c.KNEE_BATCH][0] == pytest.approx(row[c.KNEE_BATCH])
    assert read_table(DataDir(root), t.CAPACITY_CURVE).height > 10
    assert read_table(DataDir(root), t.CAPACITY_WINDOWS).height == 2 * len(RAMP.batches)


def test_capacity_as_csv_and_table(root: str) -> None:
    as_json = json.loads(invoke("capacity", "--data-dir", root, "--format", "json"))
    as_csv = list(csv.DictReader(io.StringIO(invoke("capacity", "--data-dir", root,
                                                    "--format", "csv"))))
    assert len(as_csv) == len(as_json) == 1
    assert list(as_csv[0]) == list(as_json[0])
    assert as_csv[0][c.KNEE_LIMIT] == "tpot"
    table = invoke("capacity", "--data-dir", root)
    assert "chat" in table and "tpot" in table and "1 pools" in table
    assert f"knee: batch {as_json[0][c.KNEE_BATCH]:.0f} (" in table
    assert max(len(line) for line in table.splitlines()) <= 100


def test_capacity_on_a_directory_without_engines_says_so(tmp_path) -> None:  # noqa: ANN001
    data = DataDir(tmp_path / "data")
    data.root.mkdir(parents=True)
    out = invoke("capacity", "--data-dir", str(data.root))
    assert "no capacity rows" in out
