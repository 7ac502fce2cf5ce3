"""Golden tests on small hand-made inputs: every expected number is worked out by hand."""

from __future__ import annotations

import json

import polars as pl
import pytest

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.normalize import normalize
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.samples import gpu_samples
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect
from tests.pipeline.rawdata import (
    NS,
    T0,
    gpu_points,
    instance_gpu_point,
    point,
    points_frame,
    span,
    spans_frame,
    vllm_span,
    write_raw,
)

NO_MODELS = pl.DataFrame(schema={"instance_id": pl.String, "model": pl.String})


def _one(rows: list[dict], dims: dict[str, str] | None = None) -> pl.DataFrame:
    return normalize(spans_frame(rows), NO_MODELS, dims or {})


def test_vllm_span_becomes_a_request_with_derived_columns() -> None:
    out = _one([vllm_span(1, start_ns=T0, e2e=1.0, queue=0.1, prefill=0.2, decode=0.6,
                          ttft=0.31, prompt=100, completion=21)]).row(0, named=True)
    assert out["request_id"] == "cmpl-1-0" and out["source"] == "vllm"
    assert out["arrival_ns"] == T0 and out["end_ns"] == T0 + NS
    assert out["inference_s"] == pytest.approx(0.8)
    assert out["tpot_s"] == pytest.approx(0.6 / 20)
    assert out["overhead_s"] == pytest.approx(1.0 - 0.1 - 0.2 - 0.6)
    assert out["instance_id"] == "h1/svc" and out["model"] == ""
    assert out["finish_reason"] == "stop" and out["is_error"] is False


def test_missing_prefill_or_decode_attributes() -> None:
    # prefill missing, inference present: prefill = inference - decode
    row = vllm_span(1, start_ns=T0, prefill=None, decode=0.5)
    row[next(k for k in row if k.endswith("inference_s"))] = 0.7
    only_prefill_missing = _one([row]).row(0, named=True)
    assert only_prefill_missing["prefill_s"] == pytest.approx(0.2)
    # both missing: no phases, no overhead; e2e and ttft still there
    both = _one([vllm_span(2, start_ns=T0, prefill=None, decode=None)]).row(0, named=True)
    assert both["prefill_s"] is None and both["decode_s"] is None
    assert both["overhead_s"] is None and both["tpot_s"] is None
    assert both["e2e_s"] == pytest.approx(1.0) and both["ttft_s"] == pytest.approx(0.35)


def test_vllm_requests_aborted_before_a_step_have_no_negative_phases() -> None:
    """vLLM 0.32 subtracts engine timestamps that stay 0.0 when a step never happened."""
    never_scheduled = vllm_span(1, start_ns=T0, queue=-5123.4, prefill=0.0, decode=0.0,
                                ttft=0.0, completion=0, finish=None)
    no_first_token = vllm_span(2, start_ns=T0, queue=0.3, prefill=-812.0, decode=0.0,
                               ttft=0.0, completion=0, finish=None)
    no_first_token[next(k for k in no_first_token if k.endswith("inference_s"))] = -812.0
    normal = vllm_span(3, start_ns=T0, ttft=0.35)
    rows = _one([never_scheduled, no_first_token, normal]).sort("trace_id").to_dicts()
    first, second, third = rows
    assert first["queue_s"] is None and first["prefill_s"] == 0.0  # both stamps were 0.0
    assert first["ttft_s"] is None and first["overhead_s"] is None
    assert second["queue_s"] == pytest.approx(0.3)
    assert second["prefill_s"] is None and second["inference_s"] is None
    assert second["ttft_s"] is None and second["overhead_s"] is None
    assert third["ttft_s"] == pytest.approx(0.35)  # so a window's TTFT is the real one's
    assert all(r[col] is None or r[col] >= 0 for r in rows
               for col in ("queue_s", "prefill_s", "decode_s", "inference_s", "ttft_s",
                           "e2e_s", "overhead_s"))


@pytest.mark.parametrize("completion,tpot", [(0, None), (1, None), (2, 0.6), (None, None)])
def test_zero_and_one_output_token_have_no_tpot(completion, tpot) -> None:
    out = _one([vllm_span(1, start_ns=T0, completion=completion)]).row(0, named=True)
    assert out["output_tokens"] == completion
    assert out["tpot_s"] == (pytest.approx(tpot) if tpot else None)


def test_finish_reasons_json_string_array_and_errors() -> None:
    rows = [
        vllm_span(1, start_ns=T0, finish="length"),
        vllm_span(2, start_ns=T0, finish="abort"),
        vllm_span(3, start_ns=T0, finish=None, status=2),
        span(4, 1, "chat", start_ns=T0, end_ns=T0 + 2 * NS, kind=3, model="gpt-x",
             attrs={a.GEN_AI_OUTPUT_TOKENS: 3, a.GEN_AI_FINISH_REASONS: ["stop", "length"],
                    a.ERROR_TYPE: "timeout"}),
    ]
    out = _one(rows).sort("trace_id")
    assert out["finish_reason"].to_list() == ["length", "abort", None, "stop"]
    assert out["is_error"].to_list() == [False, True, True, True]
    assert out["source"].to_list() == ["vllm", "vllm", "vllm", "genai"]


def test_genai_conventions_client_server_pair_counts_once() -> None:
    client = span(5, 1, "chat llama", start_ns=T0, end_ns=T0 + 3 * NS, kind=3,
                  attrs={a.GEN_AI_OPERATION_NAME: "chat", a.GEN_AI_INPUT_TOKENS: 10})
    server = span(5, 2, "chat llama", start_ns=T0 + NS // 10, end_ns=T0 + 2 * NS, kind=2,
                  parent=f"{1:016x}", model="llama",
                  attrs={a.GEN_AI_INPUT_TOKENS: 10, a.GEN_AI_OUTPUT_TOKENS: 4,
                         a.GEN_AI_CACHED_INPUT_TOKENS: 6, a.GEN_AI_RESPONSE_ID: "resp-9"})
    out = _one([client, server]).row(0, named=True)
    assert _one([client, server]).height == 1
    assert out["request_id"] == "resp-9" and out["model"] == "llama"
    assert (out["input_tokens"], out["output_tokens"], out["cached_tokens"]) == (10, 4, 6)
    assert out["e2e_s"] == pytest.approx(1.9) and out["source"] == "genai"


def test_startup_internal_and_duplicate_spans() -> None:
    rows = [
        vllm_span(1, start_ns=T0), vllm_span(1, start_ns=T0, received_ns=T0 + 99 * NS),
        span(2, 1, "init_engine", start_ns=T0, end_ns=T0 + NS,
             attrs={a.CODE_FILEPATH: "/opt/vllm/engine.py"}),
        span(3, 1, "http.request", start_ns=T0, end_ns=T0 + NS, kind=2),
        span(4, 1, a.GATEWAY_SPAN, start_ns=T0, end_ns=T0 + NS, kind=2),
    ]
    out = _one(rows)
    assert out.height == 1 and out["trace_id"][0] == f"{1:032x}"


def test_gateway_overhead_and_model_sources() -> None:
    gw = span(7, 9, a.GATEWAY_SPAN, start_ns=T0 - NS // 20, end_ns=T0 + NS + NS // 20, kind=2)
    eng = vllm_span(7, start_ns=T0, e2e=1.0, parent=f"{9:016x}",
                    res_extra={"llm.model": "from-resource", "region": "eu"},
                    attrs={"region": "us"})
    models = pl.DataFrame({"instance_id": ["h1/svc"], "model": ["from-agent"]})
    out = normalize(spans_frame([gw, eng]), models, {"region": "region"}).row(0, named=True)
    assert out["network_s"] == pytest.approx(0.1)
    assert out["model"] == "from-resource"
    assert out["region"] == "us"  # a span attribute wins over the resource
    agent = normalize(spans_frame([vllm_span(8, start_ns=T0)]), models, {}).row(0, named=True)
    assert agent["model"] == "from-agent"


def test_a_failed_gateway_span_no_engine_answered_is_one_failed_request() -> None:
    routed = {a.SERVER_ADDRESS: "h2", a.FLEETLENS_INSTANCE_ID: "h2/chat",
              a.HTTP_RESPONSE_STATUS_CODE: 503, a.ERROR_TYPE: "503"}
    refused = span(5, 9, a.GATEWAY_SPAN, start_ns=T0, end_ns=T0 + NS // 1000, kind=2,
                   status=2, attrs=routed, service="gw", host="gw-01", model="m")
    # the same instance answered another request: its service names the failed one's
    answered_gw = span(6, 9, a.GATEWAY_SPAN, start_ns=T0, end_ns=T0 + 2 * NS, kind=2,
                       attrs=routed, service="gw", host="gw-01")
    answered = vllm_span(6, start_ns=T0, e2e=1.0, parent=f"{9:016x}", service="chat",
                         host="h2", res_extra={a.SERVICE_INSTANCE_ID: "h2/chat"})
    # a gateway error the engine did answer is the engine's request, counted once
    errored_gw = span(7, 9, a.GATEWAY_SPAN, start_ns=T0, end_ns=T0 + 2 * NS, kind=2,
                      status=2, attrs=routed, service="gw", host="gw-01")
    errored = vllm_span(7, start_ns=T0, e2e=1.0, parent=f"{9:016x}", service="chat",
                        host="h2", finish="abort", res_extra={a.SERVICE_INSTANCE_ID: "h2/chat"})
    out = normalize(spans_frame([refused, answered_gw, answered, errored_gw, errored]),
                    NO_MODELS, {}).sort(c.TRACE_ID)
    assert out.height == 3
    failed = out.row(0, named=True)
    assert (failed[c.SOURCE], failed[c.IS_ERROR], failed[c.HOST_NAME], failed[c.INSTANCE_ID],
            failed[c.SERVICE_NAME], failed[c.MODEL]) == ("gateway", True, "h2", "h2/chat",
                                                         "chat", "m")
    assert failed[c.E2E_S] == pytest.approx(0.001)
    assert failed[c.TTFT_S] is None and failed[c.NETWORK_S] is None
    assert out[c.IS_ERROR].to_list() == [True, False, True]
    assert out[c.SOURCE].to_list() == ["gateway", "vllm", "vllm"]


def test_units_are_normalised_and_counter_resets_handled() -> None:
    attrs = {a.HW_ID: "GPU-x", a.HW_NAME: "H100", a.GPU_INDEX: 3}
    rows = [point(a.HW_POWER, T0 + i * NS, 250_000.0, attrs=attrs, unit="mW") for i in range(4)]
    counter = [1_000_000.0, 1_200_000.0, 50_000.0, 250_000.0]  # mJ, restarted before the 3rd
    rows += [point(a.HW_ENERGY, T0 + i * NS, v, attrs=attrs, unit="mJ", kind="sum",
                   monotonic=True) for i, v in enumerate(counter)]
    rows += [point(a.HW_GPU_UTILIZATION, T0 + i * NS, 87.0, attrs=attrs, unit="%")
             for i in range(4)]
    out = gpu_samples(points_frame(rows), 60.0)
    assert out["power_w"].to_list() == [250.0] * 4
    assert out["energy_j"].to_list() == [1000.0, 1200.0, 50.0, 250.0]
    assert out["energy_delta_j"].to_list() == [None, 200.0, 50.0, 200.0]
    assert out["util_gpu"].to_list() == pytest.approx([0.87] * 4)
    assert out["gpu_index"].to_list() == [3] * 4 and out["gpu_model"][0] == "H100"


def test_delta_temporality_energy_and_sample_gaps() -> None:
    attrs = {a.HW_ID: "GPU-d"}
    rows = [point(a.HW_ENERGY, T0 + i * NS, 10.0, attrs=attrs, unit="J", kind="sum")
            for i in range(3)]
    for r in rows:
        r["temporality"] = "delta"
    rows += [point(a.HW_POWER, T0 + s * NS, 100.0, attrs={a.HW_ID: "GPU-p"}) for s in (0, 1, 200)]
    out = gpu_samples(points_frame(rows), 60.0).sort("gpu_uuid", "ts_ns")
    assert out["energy_delta_j"].to_list() == [10.0, 10.0, 10.0, None, 100.0, None]


def _energy_dir(tmp_path, spans: list[dict], *, mapped: bool = True) -> DataDir:
    dd = DataDir(tmp_path / "data")
    write_raw(dd, t.SPANS, spans_frame(spans))
    pts = []
    for k in range(0, 301):  # 30 s of 10 Hz samples at 100 W, counter in J
        pts += gpu_points("GPU-0", T0 + k * NS // 10, power=100.0, energy=k * 10.0)
        pts += gpu_points("GPU-1", T0 + k * NS // 10, power=100.0, energy=None, index=1)
    if mapped:
        pts.append(instance_gpu_point("i0", "GPU-0", T0))
    write_raw(dd, t.METRIC_POINTS, points_frame(pts))
    return dd


def test_energy_split_by_tokens_with_idle_reported(tmp_path) -> None:
    # Slot [0, 10 s) on GPU-0 holds 1000 J. Request A prefills 100 tokens over [0, 1 s) and
    # makes 1 token; request B prefills instantly (1 token) and decodes 10 steps over [0, 5 s).
    # Active 5 s of 10 s: 500 J attributed (A 100/111, B 11/111), 500 J idle.
    res = {a.SERVICE_INSTANCE_ID: "i0"}
    req_a = vllm_span(1, start_ns=T0, e2e=1.0, queue=0.0, prefill=1.0, decode=0.0, ttft=1.0,
                      prompt=100, completion=1, res_extra=res)
    req_b = vllm_span(2, start_ns=T0, e2e=5.0, queue=0.0, prefill=0.0, decode=5.0, ttft=0.0,
                      prompt=0, completion=11, res_extra=res)
    dd = _energy_dir(tmp_path, [req_a, req_b])
    Pipeline(dd, PipelineConfig()).run_once()
    con = connect(dd)
    got = dict(con.sql("select request_id, energy_j from request_energy").fetchall())
    assert got["cmpl-1-0"] == pytest.approx(500 * 100 / 111, abs=1e-5)
    assert got["cmpl-2-0"] == pytest.approx(500 * 11 / 111, abs=1e-5)
    per_gpu = con.sql("select gpu_uuid, measured_j, attributed_j, idle_j, active_s "
                      "from gpu_window_energy order by 1").fetchall()
    # one window holds all 30 s: GPU-0 1000 J attributed-or-idle in slot 1, 2000 J idle after
    assert per_gpu[0] == ("GPU-0", pytest.approx(3000.0), pytest.approx(500.0, abs=1e-5),
                          pytest.approx(2500.0, abs=1e-5), pytest.approx(5.0))
    # GPU-1 has no counter (trapezoid) and serves no mapped instance: all idle
    assert per_gpu[1] == ("GPU-1", pytest.approx(3000.0), 0.0, pytest.approx(3000.0), 0.0)
    win = con.sql("select energy_j, j_per_token, output_tokens from windows "
                  "where host_name = 'h1'").fetchall()[0]
    assert win[0] == pytest.approx(500.0, abs=1e-5) and win[1] == pytest.approx(500.0 / 12)


def test_unmapped_instance_uses_every_gpu_of_its_host(tmp_path) -> None:
    req = vllm_span(1, start_ns=T0, e2e=10.0, queue=0.0, prefill=0.0, decode=10.0, ttft=0.0,
                    prompt=1, completion=101)
    dd = _energy_dir(tmp_path, [req], mapped=False)
    Pipeline(dd, PipelineConfig()).run_once()
    con = connect(dd)
    energy, coverage, per_token = con.sql(
        "select energy_j, attribution_coverage, j_per_token from request_energy").fetchall()[0]
    assert energy == pytest.approx(2000.0, abs=1e-4)  # both GPUs' whole first slot
    assert coverage == pytest.approx(1.0) and per_token == pytest.approx(2000.0 / 101, abs=1e-5)


def test_request_on_a_host_without_gpus_has_no_energy(tmp_path) -> None:
    dd = _energy_dir(tmp_path, [vllm_span(1, start_ns=T0, host="cpu-only")])
    Pipeline(dd, PipelineConfig()).run_once()
    row = connect(dd).sql("select energy_j, attribution_coverage from request_energy").fetchall()
    assert row == [(None, 0.0)]


def test_clock_skew_between_host_and_collector(tmp_path) -> None:
    """Host h2's clock runs 10 minutes ahead of the collector's: its rows are neither dropped
    as late nor misattributed (spans and GPU samples share the host clock), and the run reports
    the skew as a negative export delay."""
    skew = 600 * NS
    dd = DataDir(tmp_path / "data")
    job = Pipeline(dd, PipelineConfig(lateness_s=60))
    first = [vllm_span(1, start_ns=T0, host="h1", received_ns=T0 + 2 * NS)]
    write_raw(dd, t.SPANS, spans_frame(first), writer="a", seq=1)
    job.run_once()
    skewed = [vllm_span(i, start_ns=T0 + skew + i * NS, host="h2", received_ns=T0 + 3 * NS,
                        res_extra={a.SERVICE_INSTANCE_ID: "h2-i"}) for i in range(2, 6)]
    pts = []
    for k in range(0, 200):
        pts += gpu_points("GPU-h2", T0 + skew + k * NS // 10, power=200.0, energy=k * 20.0,
                          host="h2")
    pts.append(instance_gpu_point("h2-i", "GPU-h2", T0 + skew, host="h2"))
    write_raw(dd, t.SPANS, spans_frame(skewed), writer="a", seq=2)
    write_raw(dd, t.METRIC_POINTS, points_frame(pts), writer="a", seq=3)
    summary = job.run_once()
    assert summary.too_late_rows == 0
    assert summary.export_delay_s["h2"] < -590
    # later h1 data is judged against h1's own watermark, not h2's clock
    write_raw(dd, t.SPANS, spans_frame([vllm_span(9, start_ns=T0 + 5 * NS, host="h1")]),
              writer="a", seq=4)
    assert job.run_once().too_late_rows == 0
    con = connect(dd)
    assert con.sql("select count(*) from requests").fetchall()[0][0] == 6
    cov = con.sql("select min(attribution_coverage) from request_energy e join requests r "
                  "using (request_id) where r.host_name = 'h2'").fetchall()[0][0]
    assert cov == pytest.approx(1.0)
    assert json.loads((dd.state / "pipeline.json").read_text())["watermarks"].keys() == {
        "h1", "h2"}


def test_counter_increase_spans_a_sample_without_the_counter_and_restarts() -> None:
    from fleetlens.pipeline.samples import counter_increase

    frame = pl.DataFrame({"series": ["a"] * 6 + ["b"] * 2,
                          "total": [100, None, 160, 10, None, 30, 5, 7]})
    out = frame.select(counter_increase(pl.col("total"), ["series"]).alias("inc"))
    # a: +60 across the missing scrape, a restart counts its new value, then +20 across the
    # second gap; b starts its own series.
    assert out["inc"].to_list() == [None, None, 60, 10, None, 20, None, 2]
