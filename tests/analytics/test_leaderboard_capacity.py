"""``fleetlens leaderboard`` carries each configuration's goodput per GPU and J/token at the
knee from the stored `capacity` table (issue 31 item 6), over a data directory holding a
fleet whose step time and power are known (:mod:`tests.analytics.capacity_ramp`)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.leaderboard import at_the_knee
from fleetlens.analytics.runner import read_table, run
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.capacity_ramp import Ramp, write_ramp

RAMP = Ramp(batches=tuple(np.linspace(1, 140, 40)), tp=2, idle_w=120.0, per_seq_w=2.5)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    data = DataDir(tmp_path_factory.mktemp("leaderboard-capacity") / "data")
    write_ramp(RAMP, data)
    run(data, notify=False)
    return data


def invoke(*args: str) -> str:
    out = CliRunner().invoke(cli, list(args))
    assert out.exit_code == 0, out.output
    return out.stdout


def test_the_leaderboard_shows_the_stored_knee_figures(root: DataDir) -> None:
    stored = read_table(root, t.CAPACITY).row(0, named=True)
    board = json.loads(invoke("leaderboard", "--data-dir", str(root.root), "--samples", "10",
                              "--include-incidents", "--format", "json"))["leaderboard"]
    assert len(board) == 1
    row = board[0]
    assert row[c.CONFIG] == "tp=2"
    assert row[c.GOODPUT_RPS_PER_GPU] == pytest.approx(stored[c.GOODPUT_RPS_PER_GPU])
    assert row[c.J_PER_TOKEN_KNEE] == pytest.approx(stored[c.J_PER_TOKEN_KNEE])
    # and the stored figures are the fleet's physics at its knee
    assert row[c.J_PER_TOKEN_KNEE] == pytest.approx(RAMP.j_per_token(RAMP.knee()), rel=0.03)
    per_gpu = RAMP.rps(RAMP.knee()) / RAMP.tp
    assert per_gpu * 0.93 <= row[c.GOODPUT_RPS_PER_GPU] <= per_gpu * 1.05
    table = invoke("leaderboard", "--data-dir", str(root.root), "--samples", "10",
                   "--include-incidents")
    assert "J/token@knee" in table and f"{row[c.J_PER_TOKEN_KNEE]:.3f}" in table


def test_pools_join_on_model_gpu_and_tp_and_share_by_instances() -> None:
    board = pl.DataFrame({c.MODEL: ["m", "m", "m"], c.GPU_MODEL: ["H100", "H100", "A100"],
                          "_tp": [1.0, 2.0, 1.0]})
    capacity = pl.DataFrame({
        c.MODEL: ["m", "m", "m", "m"], c.GPU_MODEL: ["H100", "H100", "H100", "A100"],
        c.TP: [1, 1, 2, 1], c.INSTANCES: [1, 3, 2, 2], c.KNEE_BATCH: [10.0, 12.0, 8.0, None],
        c.GOODPUT_RPS_PER_GPU: [2.0, 4.0, 1.0, None], c.J_PER_TOKEN_KNEE: [0.4, 0.2, None, None],
    })
    got = at_the_knee(board, capacity)
    assert got[c.GOODPUT_RPS_PER_GPU][:2].to_list() == pytest.approx([3.5, 1.0])
    assert got[c.J_PER_TOKEN_KNEE][0] == pytest.approx(0.25)
    # a pool without a knee (too little data) gives no figure, not a zero
    assert got[c.J_PER_TOKEN_KNEE][1] is None and got[c.GOODPUT_RPS_PER_GPU][2] is None


def test_without_a_capacity_table_the_columns_are_empty(root: DataDir) -> None:
    board = pl.DataFrame({c.MODEL: ["m"], c.GPU_MODEL: ["H100"], "_tp": [1.0]})
    got = at_the_knee(board, t.table(t.CAPACITY).empty())
    assert got[c.J_PER_TOKEN_KNEE].to_list() == [None]
