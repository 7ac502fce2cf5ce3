"""The pipeline reads the names users already send: semantic-conventions v1.41.0 GPU metrics
(hw.gpu.memory.utilization is the fraction of memory USED; hw.model), the GenAI cache key in
both spellings, and vLLM's finished requests and KV capacity (issue 14)."""

from __future__ import annotations

import json

import polars as pl

from fleetlens.pipeline.health import engine_configs, gpu_health
from fleetlens.pipeline.normalize import normalize
from fleetlens.pipeline.samples import engine_samples, gpu_samples
from fleetlens.pipeline.schema import attributes as a
from tests.pipeline.rawdata import NS, T0, engine_point, point, points_frame, span, spans_frame

NO_MODELS = pl.DataFrame(schema={"instance_id": pl.String, "model": pl.String})


def test_memory_controller_busy_share_is_util_mem_and_used_fraction_is_not() -> None:
    attrs = {a.HW_ID: "GPU-n", a.HW_NAME: "gpu 0", a.HW_MODEL: "NVIDIA H100 80GB HBM3"}
    rows = [point("gpu.memory_controller.utilization", T0, 0.25, attrs=attrs, unit="1"),
            point("hw.gpu.memory.utilization", T0, 0.9, attrs=attrs, unit="1")]  # 90 % used
    out = gpu_samples(points_frame(rows), 60.0).row(0, named=True)
    assert out["util_mem"] == 0.25
    assert out["gpu_model"] == "NVIDIA H100 80GB HBM3"  # hw.model before hw.name


def test_older_senders_memory_utilization_is_still_read_when_alone() -> None:
    rows = [point("hw.gpu.memory.utilization", T0, 0.4, attrs={a.HW_ID: "GPU-o",
                                                                a.HW_NAME: "H100"})]
    out = gpu_samples(points_frame(rows), 60.0).row(0, named=True)
    assert out["util_mem"] == 0.4 and out["gpu_model"] == "H100"


def test_usage_and_limit_as_updowncounters() -> None:
    attrs = {a.HW_ID: "GPU-u"}
    rows = [point("hw.gpu.memory.usage", T0, 60e9, attrs=attrs, unit="By", kind="sum"),
            point("hw.gpu.memory.limit", T0, 80e9, attrs=attrs, unit="By", kind="sum")]
    out = gpu_samples(points_frame(rows), 60.0).row(0, named=True)
    assert (out["mem_used_bytes"], out["mem_total_bytes"]) == (60e9, 80e9)


def test_cached_input_tokens_in_the_current_and_the_old_spelling() -> None:
    def request(trace: int, key: str) -> dict:
        return span(trace, 1, "chat m", start_ns=T0, end_ns=T0 + NS, kind=2, model="m",
                    attrs={a.GEN_AI_INPUT_TOKENS: 10, a.GEN_AI_OUTPUT_TOKENS: 2, key: 7})
    rows = [request(1, "gen_ai.usage.cache_read.input_tokens"),
            request(2, "gen_ai.usage.cache_read_input_tokens")]
    out = normalize(spans_frame(rows), NO_MODELS, {}).sort("trace_id")
    assert out["cached_tokens"].to_list() == [7, 7]


def _finished(reason: str, ts_ns: int, value: float, name: str = "vllm.requests.finished"):
    row = engine_point(a.ENGINE_PREEMPTIONS, "h1/vllm", ts_ns, value)
    row["metric_name"] = name
    row["attributes"] = row["attributes"][:-1] + f', "finished_reason": "{reason}"}}'
    return row


def test_finished_requests_by_reason_and_kv_capacity_in_engine_samples() -> None:
    rows = [engine_point(a.ENGINE_NUM_RUNNING, "h1/vllm", T0 + i * NS, 3.0) for i in range(2)]
    rows += [_finished("stop", T0, 90), _finished("length", T0, 5), _finished("abort", T0, 4),
             _finished("error", T0, 1), _finished("stop", T0 + NS, 95),
             _finished("length", T0 + NS, 5), _finished("abort", T0 + NS, 6),
             _finished("error", T0 + NS, 1)]
    rows.append(engine_point(a.ENGINE_NUM_RUNNING, "h1/vllm", T0, 0.0))  # a repeat, ignored
    rows.append(engine_point("vllm.kv_cache.capacity", "h1/vllm", T0, 4194304.0))
    out = engine_samples(points_frame(rows)).sort("ts_ns")
    assert out["requests_finished_total"].to_list() == [100.0, 107.0]
    assert out["requests_aborted_total"].to_list() == [4.0, 6.0]
    assert out["requests_errored_total"].to_list() == [1.0, 1.0]
    assert out["kv_capacity_tokens"].to_list() == [4194304.0, None]


def test_vllms_own_family_name_is_read_too() -> None:
    rows = [_finished("abort", T0, 2, name="vllm:request_success_total"),
            _finished("stop", T0, 8, name="vllm:request_success_total")]
    out = engine_samples(points_frame(rows)).row(0, named=True)
    assert (out["requests_finished_total"], out["requests_aborted_total"]) == (10.0, 2.0)
    assert out["requests_errored_total"] is None


def test_liveness_and_start_time_in_engine_samples() -> None:
    # up at T0 with its start time; a failed scrape at T0+1 s sends up=0 alone
    rows = [engine_point(a.ENGINE_NUM_RUNNING, "h1/vllm", T0, 3.0),
            engine_point(a.ENGINE_UP, "h1/vllm", T0, 1.0),
            engine_point(a.ENGINE_START_TIME, "h1/vllm", T0, 1_790_000_000.5),
            engine_point(a.ENGINE_UP, "h1/vllm", T0 + NS, 0.0)]
    out = engine_samples(points_frame(rows)).sort("ts_ns")
    assert out["up"].to_list() == [1.0, 0.0]
    assert out["process_start_time_s"].to_list() == [1_790_000_000.5, None]
    assert out["num_running"].to_list() == [3.0, None]
    assert out["instance_id"].to_list() == ["h1/vllm", "h1/vllm"]


def _config(ts_ns: int, fingerprint: str, version: str, seqs: int) -> dict:
    row = engine_point(a.ENGINE_CONFIG_INFO, "h1/vllm", ts_ns, 1.0)
    attrs = json.loads(row["attributes"])
    attrs.update({a.ENGINE_CONFIG_FINGERPRINT: fingerprint, a.ENGINE_VERSION: version,
                  a.ENGINE_CONFIG_JSON: json.dumps({"max_num_seqs": seqs, "version": version})})
    row["attributes"] = json.dumps(attrs, sort_keys=True)
    return row


def test_engine_configurations_one_row_per_fingerprint_with_first_and_last_seen() -> None:
    rows = [_config(T0 + i * NS, "aaaa", "0.11.0", 256) for i in range(3)]
    rows += [_config(T0 + i * NS, "bbbb", "0.11.1", 2) for i in range(3, 5)]
    rows.append(engine_point(a.ENGINE_NUM_RUNNING, "h1/vllm", T0, 3.0))  # not a configuration
    out = engine_configs(points_frame(rows))
    assert out.select("config_fingerprint", "engine_version", "start_ns", "end_ns").rows() == [
        ("aaaa", "0.11.0", T0, T0 + 2 * NS), ("bbbb", "0.11.1", T0 + 3 * NS, T0 + 4 * NS)]
    assert json.loads(out["config_json"][1]) == {"max_num_seqs": 2, "version": "0.11.1"}
    assert out["instance_id"].to_list() == ["h1/vllm", "h1/vllm"]


def test_gpu_health_keeps_the_readings_that_changed() -> None:
    gpu = {a.HW_ID: "GPU-1", a.GPU_INDEX: 0}
    rows = [point(a.GPU_LOST, T0 + i * NS, 1.0 if i in (3, 4) else 0.0, attrs=gpu)
            for i in range(6)]
    rows += [point(a.GPU_XID_ERRORS, T0 + i * NS, 1.0 if i < 4 else 2.0, kind="sum",
                   attrs={**gpu, a.GPU_XID_CODE: 79}) for i in range(2, 6)]
    rows.append(point(a.GPU_LOST, T0 + 3 * NS, 1.0, attrs=gpu))  # a repeated delivery
    out = gpu_health(points_frame(rows))
    assert out.select("signal", "detail", "ts_ns", "value").rows() == [
        ("lost", "", T0, 0.0), ("lost", "", T0 + 3 * NS, 1.0), ("lost", "", T0 + 5 * NS, 0.0),
        ("xid_errors", "79", T0 + 2 * NS, 1.0), ("xid_errors", "79", T0 + 4 * NS, 2.0)]
    assert set(out["gpu_uuid"]) == {"GPU-1"}


def test_a_configuration_that_comes_back_is_a_run_of_its_own() -> None:
    rows = [_config(T0 + i * NS, "aaaa", "0.11.0", 256) for i in (0, 1, 4, 5)]
    rows += [_config(T0 + i * NS, "bbbb", "0.11.1", 2) for i in (2, 3)]  # then rolled back
    out = engine_configs(points_frame(rows))
    assert out.select("config_fingerprint", "start_ns", "end_ns").rows() == [
        ("aaaa", T0, T0 + NS), ("bbbb", T0 + 2 * NS, T0 + 3 * NS),
        ("aaaa", T0 + 4 * NS, T0 + 5 * NS)]
