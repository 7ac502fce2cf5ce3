"""The scoring of ``bench/traces_random.py`` (issue 35's random-fleet check) on one small
synthetic fleet with a known incident: a queue spike on one host from KV pressure. The slow
band of the metric the control found moved, in the moved service's view, names the host
first; another subject does not match; what cannot be selected on the heatmap is left out."""

from __future__ import annotations

import pytest

from bench.traces_random import at_grain, quantile_of, score_incidents, slow_band, view_of
from fleetlens.analytics.traces.compare import view_frame
from fleetlens.analytics.traces.query import TraceQuery
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect
from tests.dashboard.synth import SERVICES, Fleet, build_all


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    root = DataDir(tmp_path_factory.mktemp("traces-random") / "data")
    spec = build_all(root, Fleet(hours=1.0))
    con = connect(root, tables=(t.REQUESTS, t.INSTANCE_GPUS))
    try:
        return spec, view_frame(con, TraceQuery())
    finally:
        con.close()


def _incident(spec: Fleet, subject: str) -> dict:
    host, start, end = spec.incident
    return {"cause": "kv_cache_pressure", "subject": subject, c.START_NS: start,
            c.END_NS: end, "host_name": host}


def test_the_slow_band_names_the_injected_host_first(fleet) -> None:
    spec, frame = fleet
    host = spec.incident[0]
    # the whole fleet as the view (no service named): in the incident service's view its
    # host is also its only A100, and gpu_model=A100 ties with it
    moved = {"valid": True, "metric": "queue_p90", "service": ""}
    cases, left_out = score_incidents(
        frame, "synth", [_incident(spec, f"{c.HOST_NAME}={host}"),
                         _incident(spec, f"{c.HOST_NAME}=gpu-host-00")], [moved, moved])
    assert left_out == []
    right, wrong = cases
    assert right.matched and right.rank == 1 and right.top == f"{c.HOST_NAME}={host}"
    assert right.metric == "queue_p90" and right.selected >= 5
    assert not wrong.matched and wrong.rank != 1  # the same band, another subject


def test_the_view_is_the_moved_service_unless_the_subject_is_a_service(fleet) -> None:
    _, frame = fleet
    scoped = view_of(frame, f"{c.HOST_NAME}=gpu-host-01", SERVICES[0])
    assert set(scoped[c.SERVICE_NAME]) == {SERVICES[0]}
    assert view_of(frame, f"{c.SERVICE_NAME}={SERVICES[0]}", SERVICES[0]).equals(frame)


def test_what_the_heatmap_cannot_select_is_left_out(fleet) -> None:
    spec, frame = fleet
    inc = _incident(spec, f"{c.HOST_NAME}={spec.incident[0]}")
    verdicts = [{"valid": False, "metric": "ttft_p90", "service": SERVICES[0]},
                {"valid": True, "metric": "telemetry", "service": ""},
                {"valid": True, "metric": "client_ttft_p90", "service": SERVICES[0]}]
    cases, left_out = score_incidents(frame, "synth", [inc] * 3, verdicts)
    assert cases == [] and len(left_out) == 3
    assert "dropped" in left_out[0] and "client_ttft_p90" in left_out[2]


def test_the_band_starts_at_the_baseline_quantile_outside_the_span(fleet) -> None:
    spec, frame = fleet
    _, start, end = spec.incident
    assert quantile_of("ttft_p90") == 0.9 and quantile_of("e2e_p50") == 0.5
    band = slow_band(frame, start, end, c.QUEUE_S, 0.9)
    outside = frame.filter((frame[c.ARRIVAL_NS] < start) | (frame[c.ARRIVAL_NS] >= end))
    assert band.low == pytest.approx(outside[c.QUEUE_S].quantile(0.9))
    assert (band.start_ns, band.end_ns, band.high) == (start, end, None)


@pytest.fixture(scope="module")
def two_gpu_view(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """test_traces_compare_rank's fleet: h3's one instance on two GPUs slow in the span."""
    from fleetlens.pipeline.schema import conform
    from tests.analytics.test_traces_compare_rank import fleet, mapping
    from tests.dashboard.synth import write_table

    root = DataDir(tmp_path_factory.mktemp("traces-random-gpus") / "data")
    write_table(root, t.REQUESTS, conform(fleet(), t.REQUESTS), c.ARRIVAL_NS)
    write_table(root, t.INSTANCE_GPUS, conform(mapping(), t.INSTANCE_GPUS), None)
    con = connect(root, tables=(t.REQUESTS, t.INSTANCE_GPUS))
    try:
        return view_frame(con, TraceQuery())
    finally:
        con.close()


@pytest.mark.parametrize("injected", ["gpu_uuid=GPU-f", "host_name=h3", "instance_id=h3-i0"])
def test_a_gpu_of_a_two_gpu_instance_is_its_instance_and_its_host_the_same_requests(
        two_gpu_view, injected: str) -> None:
    """No request carries GPU-f (its instance runs on GPU-e and GPU-f): at the requests'
    grain the subject is the instance, which the comparison names first; the host, whose
    only instance it is, selects the same requests and matches too."""
    from tests.analytics.test_traces_compare_rank import SPAN

    inc = {"cause": "slow_gpu", "subject": injected, c.START_NS: SPAN[0], c.END_NS: SPAN[1]}
    moved = {"valid": True, "metric": "ttft_p90", "service": ""}
    (case,), left_out = score_incidents(two_gpu_view, "synth", [inc], [moved])
    assert left_out == [] and case.injected == injected
    assert case.subject == (f"{c.INSTANCE_ID}=h3-i0" if injected.startswith(c.GPU_UUID)
                            else injected)
    assert case.matched and case.rank == 1 and case.resolvable
    assert case.top == f"{c.HOST_NAME}=h3 = {c.INSTANCE_ID}=h3-i0"
    assert at_grain(two_gpu_view, "gpu_uuid=GPU-a") == "gpu_uuid=GPU-a"  # a one-GPU instance
