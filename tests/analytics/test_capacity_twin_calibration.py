"""The twin's calibration from a pool's `capacity` row and telemetry, on frames whose answer is
worked by hand (:func:`analytics.capacity.twin.calibrate`)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from fleetlens.analytics.capacity.twin import (
    DEFAULT_MAX_NUM_SEQS,
    UNLIMITED_BLOCKS,
    Calibration,
    calibrate,
)
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c

ROW = {c.MODEL: "meta-llama/Llama-3.1-8B-Instruct", c.GPU_MODEL: "NVIDIA H100 80GB HBM3",
       c.TP: 1, c.STEP_BASE_S: 0.008, c.STEP_PER_SEQ_S: 0.0005, c.STEP_PER_KV_TOKEN_S: 0.0,
       c.STEP_HINGE_BATCH: None, c.STEP_PER_SEQ_ABOVE_S: 0.0, c.TPOT_SLO_S: 0.02,
       c.TTFT_SLO_S: 2.0}


def _requests() -> pl.DataFrame:
    prompts = np.array([200, 400, 600, 800, 1000] * 20)
    return pl.DataFrame({c.INPUT_TOKENS: prompts, c.CACHED_TOKENS: [0] * prompts.size,
                         c.PREFILL_S: 0.003 + 2e-5 * prompts,
                         c.OUTPUT_TOKENS: [100] * prompts.size})


def _configs(settings: dict) -> pl.DataFrame:
    return pl.DataFrame({c.CONFIG_JSON: [json.dumps({"cache_config": settings})]})


def _gpus() -> pl.DataFrame:
    util = np.linspace(0.0, 1.0, 11)
    return pl.DataFrame({c.UTIL_GPU: util * 100, c.POWER_W: 80.0 + 500.0 * util})


def calibration() -> Calibration:
    """A calibrated H100 pool of two engines (used by the twin's other tests)."""
    return calibrate(ROW, _requests(), None, _configs({"num_gpu_blocks": "2000",
                                                       "max_num_seqs": "64"}),
                     _gpus(), 2, AnalyticsConfig())


def test_prefill_line_limits_and_idle_power_come_from_the_telemetry() -> None:
    cal = calibration()
    assert cal.prefill_base_s == pytest.approx(0.003)
    assert cal.prefill_per_token_s == pytest.approx(2e-5)
    assert cal.kv_blocks == 2000 and cal.max_num_seqs == 64 and cal.max_batched_tokens == 8192
    assert cal.idle_w == pytest.approx(80.0)
    assert cal.engines == 2 and cal.tpot_slo_s == 0.02 and not np.isfinite(cal.hinge)
    assert any("max_num_batched_tokens 8192" in note for note in cal.notes)


def test_the_prompts_riding_in_the_decode_steps_come_off_the_slope() -> None:
    # the mean prompt (600) takes 0.003 + 0.012 s, 0.007 s more than the step's base; one
    # arrives per 100 decode steps of each running sequence
    assert calibration().per_seq_s == pytest.approx(0.0005 - 0.007 / 100)
    steep = calibrate({**ROW, c.STEP_PER_SEQ_S: 1e-5}, _requests(), None, _configs({}),
                      _gpus(), 2, AnalyticsConfig())
    assert steep.per_seq_s == 0.0  # never below nothing


def test_without_configuration_vllm_defaults_and_kv_from_the_model_shape() -> None:
    cal = calibrate(ROW, _requests(), None, _configs({}), _gpus(), 1, AnalyticsConfig())
    assert cal.max_num_seqs == DEFAULT_MAX_NUM_SEQS
    # 80 GB x 0.9 - 2 GB - 16.06 GB of weights over 128 KiB of KV per token, in 16s
    assert cal.kv_blocks == int((80e9 * 0.9 - 2e9 - 8.03e9 * 2) // (131072 * 16))
    unknown = calibrate({**ROW, c.MODEL: "my-own-model"}, _requests(), 160_000.0,
                        _configs({}), _gpus(), 1, AnalyticsConfig())
    assert unknown.kv_blocks == 10_000  # the engine's report wins
    blind = calibrate({**ROW, c.MODEL: "my-own-model"}, _requests(), None, _configs({}),
                      _gpus(), 1, AnalyticsConfig())
    assert blind.kv_blocks == UNLIMITED_BLOCKS and any("unlimited" in n for n in blind.notes)
