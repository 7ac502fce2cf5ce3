"""The Leaderboard page shows each configuration's goodput per GPU and J/token at the knee
as the last analytics run stored them in `capacity` (the page computes neither)."""

from __future__ import annotations

import numpy as np
import pytest

from fleetlens.analytics.runner import read_table, run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.capacity_ramp import Ramp, write_ramp
from tests.dashboard.conftest import app_over
from tests.dashboard.test_pages import frames, open_page

RAMP = Ramp(batches=tuple(np.linspace(1, 140, 40)), tp=2, idle_w=120.0, per_seq_w=2.5)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    root = DataDir(tmp_path_factory.mktemp("leaderboard-capacity-page") / "data")
    write_ramp(RAMP, root)
    run(root, notify=False)
    return root


def test_the_leaderboard_page_shows_the_stored_knee_figures(analysed, monkeypatch) -> None:
    at = open_page(app_over(analysed, monkeypatch), "leaderboard")
    stored = read_table(analysed, t.CAPACITY).row(0, named=True)
    (table,) = frames(at)
    assert table.height == 1 and table[c.CONFIG][0] == "tp=2"
    assert table[c.GOODPUT_RPS_PER_GPU][0] == pytest.approx(stored[c.GOODPUT_RPS_PER_GPU])
    assert table[c.J_PER_TOKEN_KNEE][0] == pytest.approx(stored[c.J_PER_TOKEN_KNEE])
    assert stored[c.J_PER_TOKEN_KNEE] == pytest.approx(RAMP.j_per_token(RAMP.knee()), rel=0.03)
