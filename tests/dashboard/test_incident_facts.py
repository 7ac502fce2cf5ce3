"""Issue 32: the incident page shows the numbers ``fleetlens explain`` prints, for every
incident of the demo fleet and of a random simulated fleet.

Both render what analytics stored (`incident_phases`, `incident_dimensions`,
`incident_periods`); the page used to split its own slice of requests (the 30 minutes before,
an earlier incident's queueing included: "queue -12,830 ms" where ``explain`` said +4 ms).
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.units import signed_duration
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from tests.dashboard.conftest import app_over
from tests.dashboard.test_pages import frames, open_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def explain_json(root: DataDir, incident_id: str) -> dict:
    """``fleetlens explain ID --format json`` through its click command."""
    from fleetlens.analytics.cli import explain

    out = CliRunner().invoke(explain, [incident_id, "--data-dir", str(root.root),
                                       "--format", "json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def _frame_with(shown: list[pl.DataFrame], column: str) -> pl.DataFrame | None:
    return next((f for f in shown if column in f.columns), None)


def assert_page_matches_explain(app, root: DataDir) -> int:  # noqa: ANN001
    """Every latency incident's phases and dimensions on the page equal ``explain``'s;
    returns the number of incidents compared."""
    incidents = scan(root, t.INCIDENTS).collect()
    compared = 0
    for incident_id in incidents[c.INCIDENT_ID]:
        report = explain_json(root, incident_id)
        open_page(app, "incident_detail", id=incident_id)
        shown = frames(app)
        phases = _frame_with(shown, "excess")
        if not report["phases"]:  # a failure, or no requests compared: nothing on either
            assert phases is None, incident_id
            continue
        assert phases is not None, incident_id
        assert phases[c.PHASE].to_list() == [p[c.PHASE] for p in report["phases"]]
        assert phases["excess"].to_list() == [signed_duration(p[c.EXCESS_S])
                                              for p in report["phases"]], incident_id
        assert phases[c.SHARE].to_list() == pytest.approx(
            [p[c.SHARE] for p in report["phases"]], abs=1e-12), incident_id
        dims = _frame_with(shown, c.LIFT)
        assert dims is not None
        assert dims.select(c.DIMENSION, c.DIMENSION_VALUE).rows() == [
            (d[c.DIMENSION], d[c.DIMENSION_VALUE]) for d in report["dimensions"]]
        assert dims[c.LIFT].to_list() == pytest.approx(
            [d[c.LIFT] for d in report["dimensions"]], nan_ok=True)
        # ... and both are what the causes were ranked on (the top cause's evidence).
        ranked = next(x[c.EVIDENCE]["phases"] for x in report["causes"]
                      if "phases" in x[c.EVIDENCE])
        assert [ranked[p[c.PHASE]]["excess_ms"] / 1000 for p in report["phases"]] == \
            pytest.approx([p[c.EXCESS_S] for p in report["phases"]])
        assert report["baseline_period"][c.BASELINE_END_NS] <= \
            report["incident"][c.START_NS]
        compared += 1
    return compared


def test_demo_incident_pages_show_explains_numbers(real_demo, monkeypatch) -> None:
    app = app_over(real_demo, monkeypatch)
    assert assert_page_matches_explain(app, real_demo) >= 3


@pytest.fixture(scope="module")
def random_fleet_data(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    """A random simulated fleet (simulator.randomfleet SMALL, seed 32) run end to end:
    simulator -> real collector -> pipeline -> analytics."""
    from bench.accuracy import run_end_to_end
    from fleetlens.simulator.randomfleet import SMALL, random_fleet

    workdir = tmp_path_factory.mktemp("random-facts")
    run_end_to_end(random_fleet(32, SMALL), workdir)
    return DataDir(workdir / "data")


def test_random_fleet_incident_pages_show_explains_numbers(random_fleet_data,
                                                           monkeypatch) -> None:
    app = app_over(random_fleet_data, monkeypatch)
    assert assert_page_matches_explain(app, random_fleet_data) >= 1
