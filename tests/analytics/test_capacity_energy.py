"""J/token at the knee on hand-made fleets whose power and step time are known
(:mod:`tests.analytics.capacity_ramp`): measured where the fleet ran at the knee, from the
fits where it never did, and absent without power samples."""

from __future__ import annotations

import numpy as np
import pytest

from fleetlens.analytics.capacity.analyse import analyse_capacity
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from tests.analytics.capacity_ramp import Ramp, ramp_tables


def _row(ramp: Ramp) -> dict:
    found = analyse_capacity(ramp_tables(ramp), AnalyticsConfig(), ramp.window_s)
    assert found.capacity.height == 1
    return found.capacity.row(0, named=True)


def test_j_per_token_at_a_visited_knee_is_the_energy_of_its_windows() -> None:
    ramp = Ramp(batches=tuple(np.linspace(1, 140, 40)), tp=2, idle_w=120.0, per_seq_w=2.5)
    row = _row(ramp)
    assert not row[c.EXTRAPOLATED]
    # the windows at 0.75-1 x the knee: J/token there varies by about 1% over that band
    assert row[c.J_PER_TOKEN_KNEE] == pytest.approx(ramp.j_per_token(ramp.knee()), rel=0.03)


def test_j_per_token_at_an_extrapolated_knee_comes_from_the_fits() -> None:
    ramp = Ramp(batches=tuple(np.linspace(1, 40, 30)), idle_w=90.0, per_seq_w=4.0)
    row = _row(ramp)
    assert row[c.EXTRAPOLATED]
    # the fitted knee, not the true one: this checks the power fit x the step fit there
    assert row[c.J_PER_TOKEN_KNEE] == pytest.approx(ramp.j_per_token(row[c.KNEE_BATCH]),
                                                    rel=0.03)
    # far from the knee's own value at batch 1: the figure is the knee's
    assert row[c.J_PER_TOKEN_KNEE] < 0.5 * ramp.j_per_token(1.0)


def test_no_power_samples_no_j_per_token() -> None:
    row = _row(Ramp(batches=tuple(np.linspace(1, 140, 40))))
    assert row[c.KNEE_BATCH] is not None and row[c.J_PER_TOKEN_KNEE] is None


def test_the_step_fit_hinge_is_stored_for_the_twin() -> None:
    row = _row(Ramp(batches=tuple(np.linspace(1, 140, 40))))
    # one straight line fits the ramp: no hinge, no extra slope
    assert row[c.STEP_HINGE_BATCH] is None and row[c.STEP_PER_SEQ_ABOVE_S] == 0.0


def test_windows_without_a_batch_do_not_stop_the_fit() -> None:
    """A window with power and tokens but no running batch (NaN) is left out of the power
    fit; with it, polyfit raised LinAlgError and stopped the whole analytics run."""
    from fleetlens.analytics.capacity.energy import j_per_token_at

    batch = np.array([1.0, 5.0, np.nan, 10.0, 20.0])
    power = 100.0 + 3.0 * np.nan_to_num(batch, nan=7.0)
    tok_s = np.array([50.0, 200.0, 300.0, 380.0, 700.0])
    value = j_per_token_at(batch, power, tok_s, knee=60.0, step_s=0.05, rel=0.25)
    assert value == pytest.approx((100.0 + 3.0 * 60.0) * 0.05 / 60.0)
