from __future__ import annotations

import polars as pl
import pytest

from fleetlens.pipeline.schema import CAUSES, TABLES, SchemaError, conform, validate
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.causes import parse_subject, subject


def test_contract_names_are_exact() -> None:
    # Names outside checks rely on (DESIGN.md section 3): spot-check each table.
    assert list(TABLES) == [
        "spans", "metric_points", "log_records", "requests", "gpu_samples", "engine_samples",
        "windows", "request_energy", "baselines", "incidents", "causes", "incident_phases",
        "incident_dimensions", "incident_periods", "gpu_window_energy", "instance_gpus",
        "gpu_slot_energy", "engine_configs", "gpu_health",
        "slo_windows", "slo_status", "slo_burn_rates", "slo_alerts",
        "capacity", "capacity_windows", "capacity_curve",
    ]
    requests = t.table(t.REQUESTS).columns
    for name in ("request_id", "queue_s", "prefill_s", "decode_s", "ttft_s", "tpot_s",
                 "overhead_s", "cached_tokens", "finish_reason", "is_error", "source"):
        assert name in requests
    windows = t.table(t.WINDOWS).columns
    assert "ttft_p99_s" in windows and "decode_p50_s" in windows and "j_per_token" in windows
    assert list(t.table(t.CAUSES).columns) == [
        "incident_id", "rank", "cause", "subject", "score", "share_of_excess", "evidence",
        "summary",
    ]


def test_cause_vocabulary_is_the_documented_one() -> None:
    assert CAUSES == (
        "traffic_surge", "kv_cache_pressure", "prefix_cache_drop", "long_prompts",
        "thermal_throttle", "power_cap", "slow_gpu", "network_overhead", "collective_stall",
        "engine_overhead", "engine_down", "engine_hang", "engine_restart", "gpu_fault",
        "request_errors", "host_down", "telemetry_gap", "config_change",
    )
    assert subject("host_name", "gpu-07") == "host_name=gpu-07"
    assert parse_subject("phase=queue") == ("phase", "queue")
    with pytest.raises(ValueError, match="key=value"):
        parse_subject("queue")


def test_validate_accepts_contract_frames_and_extra_columns() -> None:
    frame = t.table(t.REQUESTS).empty().with_columns(pl.lit("eu").alias(c.REGION))
    assert validate(frame, t.REQUESTS) is frame
    assert validate(frame.lazy(), t.REQUESTS) is not None


def test_validate_names_missing_and_mistyped_columns() -> None:
    frame = t.table(t.CAUSES).empty().drop(c.SUMMARY).with_columns(pl.col(c.RANK).cast(pl.String))
    with pytest.raises(SchemaError) as err:
        validate(frame, t.CAUSES)
    assert "missing columns: summary" in str(err.value)
    assert "rank is String, expected Int64" in str(err.value)


def test_validate_unknown_table_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="known tables: spans"):
        validate(pl.DataFrame(), "nope")


def test_conform_orders_casts_and_fills() -> None:
    frame = pl.DataFrame({c.SUMMARY: ["x"], "extra": [1], c.RANK: [1.0]})
    out = conform(frame, t.CAUSES)
    assert out.columns[: len(t.table(t.CAUSES).columns)] == list(t.table(t.CAUSES).columns)
    assert out.columns[-1] == "extra"
    validate(out, t.CAUSES)
    assert out[c.RANK].to_list() == [1]
