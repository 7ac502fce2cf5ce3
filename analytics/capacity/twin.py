"""What-if on a calibrated twin (issue 31 item 5): a pool's engine model, timed by its measured
curves, with another GPU count, GPU model, ``max_num_seqs`` or arrival rate.

Calibration (:func:`calibrate`), from the pool's stored `capacity` row and its own telemetry:

- decode step time: measured on the pool's requests (:mod:`.twin_requests`: each request's
  TPOT against the batch it decoded in, with its arrivals as instrument), else, where the
  requests carry no engine timings, the row's TPOT p50 fit (``step_*``, hinge and slope past
  it). A TPOT carries the prompts that ride in its decode steps: ``batch / output`` of them
  arrive per step, each making its step longer by about ``prefill(prompt) - base``, linear
  in the batch. The twin's engine computes those prompts itself, so that share is taken off
  the per-sequence slope (never below 0);
- prefill: ``prefill_s = prefill_base + prefill_per_token x (input - cached tokens)``, least
  squares over the pool's requests (the time from the engine scheduling a request to its
  first token); through the origin where the intercept comes out negative;
- the time outside the engine (API server, the wait for the step in progress, the first
  token's way back): per request, a draw from what the pool's requests that found their
  engine idle spent there, or for one that found it busy from what those spent less half a
  step (:mod:`.twin_requests`), in place of the simulator's constants. At another arrival
  rate per engine the share that finds it idle is the calibration's to that power (M/G/inf);
- KV blocks (the engine's reported KV capacity / 16, else its ``num_gpu_blocks``),
  ``max_num_seqs`` and
  ``max_num_batched_tokens`` (its configuration), else vLLM's defaults, said in ``notes``;
- idle power per GPU: a line of the pool's GPU samples' power on their utilisation, at 0
  (the power while stepping is set on the present's energy: :func:`.twin_report.busy_power`).

:func:`changed` applies a :class:`WhatIf`. A GPU model change scales the memory-bound terms
by the ratio of HBM bandwidths, prompt compute and the slope past the hinge by the ratio of
FLOP/s, KV blocks by the memory left after the weights; its power is not known from the
fleet, so J/token is then not given. The engine itself lives in ``simulator.replay``
(analytics may not import the simulator): the command line runs it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from fleetlens.analytics.capacity.twin_requests import MIN_IDLE, request_steps
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.hardware import hbm_gbps, memory_gb, model_shape, peak_tflops
from fleetlens.pipeline.schema import columns as c

BLOCK_TOKENS = 16
#: vLLM's defaults where the engine reports no configuration
DEFAULT_MAX_NUM_SEQS, DEFAULT_MAX_BATCHED_TOKENS = 256, 8192
#: KV blocks when neither the engine nor the model shape says: as good as unlimited
UNLIMITED_BLOCKS = 1 << 20
_KEYS = ("gpus", c.GPU_MODEL, "max_num_seqs", "rate")


@dataclass(frozen=True)
class WhatIf:
    """The change: GPUs (``gpus`` absolute, else ``gpus_delta``), GPU model, max_num_seqs,
    and a multiplier of the arrival rate."""

    gpus: int | None = None
    gpus_delta: int = 0
    gpu_model: str | None = None
    max_num_seqs: int | None = None
    rate: float = 1.0

    def label(self) -> str:
        """``gpus=-2, rate=x1.5`` (``present`` when nothing changes)."""
        parts = ([f"gpus={self.gpus}"] if self.gpus is not None else
                 [f"gpus={self.gpus_delta:+d}"] if self.gpus_delta else [])
        parts += [f"gpu_model={self.gpu_model}"] if self.gpu_model else []
        parts += [f"max_num_seqs={self.max_num_seqs}"] if self.max_num_seqs else []
        parts += [f"rate=x{self.rate:g}"] if self.rate != 1.0 else []
        return ", ".join(parts) or "present"


def parse_what_if(items: tuple[str, ...] | list[str]) -> WhatIf:
    """``gpus=-2`` (relative with a sign, else absolute), ``gpu_model=H200``,
    ``max_num_seqs=128``, ``rate=2`` (or ``x2``); each item may hold several, comma-separated.

    Raises:
        ValueError: an unknown key or a bad value, naming it.
    """
    what = WhatIf()
    for item in (p.strip() for text in items for p in text.split(",") if p.strip()):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in _KEYS:
            raise ValueError(f"{item!r}: expected KEY=VALUE with KEY one of {', '.join(_KEYS)}")
        try:
            if key == "gpus":
                n = int(value)
                what = (replace(what, gpus_delta=n) if value[0] in "+-"
                        else replace(what, gpus=n))
            elif key == c.GPU_MODEL:
                what = replace(what, gpu_model=value)
            elif key == "max_num_seqs":
                what = replace(what, max_num_seqs=int(value))
            else:
                what = replace(what, rate=float(value.removeprefix("x")))
        except (ValueError, IndexError):
            raise ValueError(f"{item!r}: bad value for {key}") from None
    if (what.max_num_seqs is not None and what.max_num_seqs < 1) or what.rate <= 0:
        raise ValueError("max_num_seqs and rate must be positive")
    return what


@dataclass(frozen=True)
class Calibration:
    """One pool's twin: its engines, their measured step times, limits and power."""

    gpu_model: str
    tp: int
    engines: int
    base_s: float
    per_seq_s: float
    per_kv_s: float
    hinge: float
    above_s: float
    prefill_base_s: float
    prefill_per_token_s: float
    kv_blocks: int
    max_num_seqs: int
    max_batched_tokens: int
    idle_w: float | None
    tpot_slo_s: float
    ttft_slo_s: float
    notes: tuple[str, ...] = field(default=())
    #: per request of the calibration's frame (arrival order): its time outside the engine,
    #: s; empty where the requests carry no engine timings (the simulator's constants)
    outside_s: tuple[float, ...] = field(default=())
    #: per request as ``outside_s``: how much slower than the curves its decode and its
    #: prompt ran (the host's own variation: the twin's steps keep it); empty: 1
    decode_scale: tuple[float, ...] = field(default=())
    prefill_scale: tuple[float, ...] = field(default=())
    #: per request as ``outside_s``: a draw for an arrival that finds its engine idle, one
    #: for an arrival that finds it busy, and whether it found it idle when measured; the
    #: share that did (None: not measured)
    outside_idle_s: tuple[float, ...] = field(default=())
    outside_busy_s: tuple[float, ...] = field(default=())
    found_idle: tuple[bool, ...] = field(default=())
    p_idle: float | None = None
    #: what a step started on an idle engine takes more, s (:func:`_prefill_scale`)
    wake_s: float = 0.0


def _prefill(requests: pl.DataFrame) -> tuple[float, float, float]:
    """(prefill_base_s, prefill_per_token_s, mean prompt tokens computed) by least squares."""
    rows = requests.filter(pl.col(c.PREFILL_S).is_not_null() & (pl.col(c.PREFILL_S) >= 0))
    tokens = (rows[c.INPUT_TOKENS] - rows[c.CACHED_TOKENS].fill_null(0)).clip(lower_bound=1)
    x, y = tokens.cast(pl.Float64).to_numpy(), rows[c.PREFILL_S].to_numpy()
    if x.size == 0:
        return 0.0, 0.0, 0.0
    if np.ptp(x) <= 0:  # one prompt length: no base to tell apart
        return 0.0, float(np.mean(y) / np.mean(x)), float(np.mean(x))
    slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
    if slope < 0:  # no cost per token told: flat at the mean
        return float(np.mean(y)), 0.0, float(np.mean(x))
    if intercept < 0:
        # a prompt costs no less than nothing: the line through the origin and the means
        # (clipping the intercept to 0 and keeping the slope put prompts of 103-109
        # tokens on a real vLLM at 7.7 ms against 4.9 ms measured)
        return 0.0, float(np.mean(y) / np.mean(x)), float(np.mean(x))
    return intercept, slope, float(np.mean(x))


def _prefill_scale(requests: pl.DataFrame, base: float, per_token: float, idle: np.ndarray
                   ) -> tuple[tuple[float, ...], float]:
    """(per request, its ``prefill_s`` over the line's for its prompt (1 where not timed);
    the wake, s). An idle engine's first step is slower (on a CPU vLLM 0.4-1.2 ms more: its
    threads wake; 3.8 ms against 2.3 for the tests' tiny model): the wake is the median
    of the idle arrivals' ``prefill_s`` over the line's at the busy arrivals' median ratio,
    taken off them (their own spread kept) and added by the twin's engine to each step it
    starts from idle. Carried per request instead, it made the twin's TTFT p50 at a higher
    rate, where fewer arrivals find the engine idle, 14-27% high; left out, the twin's TTFT
    p90 at twice the rate was low (median -7% in 20 runs on a real vLLM, -21.5% at worst):
    the idle arrivals that are left, 13% of them, make its tail."""
    tokens = (requests[c.INPUT_TOKENS] - requests[c.CACHED_TOKENS].fill_null(0)).clip(
        lower_bound=1).cast(pl.Float64).to_numpy()
    line = np.maximum(base + per_token * tokens, 1e-9)
    measured = requests[c.PREFILL_S].cast(pl.Float64).to_numpy()
    ok = np.isfinite(measured) & (measured >= 0)
    ratio = np.where(ok, measured / line, 1.0)
    busy, woke = ok & ~idle, ok & idle
    wake = 0.0
    if woke.sum() >= MIN_IDLE and busy.sum() >= MIN_IDLE:
        wake = max(float(np.median(measured[woke] - line[woke] * np.median(ratio[busy]))), 0.0)
        ratio[woke] = np.maximum(measured[woke] - wake, 0.0) / line[woke]
    return tuple(float(v) for v in ratio), wake


def _idle_power(samples: pl.DataFrame) -> float | None:
    """Idle W per GPU: a line of power on utilisation (0..1 or 0..100) at 0; the lowest
    power seen where utilisation never varied."""
    ok = samples.filter(pl.col(c.POWER_W).is_not_null() & pl.col(c.UTIL_GPU).is_not_null())
    if ok.height < 2:
        return None
    util = ok[c.UTIL_GPU].cast(pl.Float64).to_numpy()
    power = ok[c.POWER_W].cast(pl.Float64).to_numpy()
    if np.ptp(util) <= 0:
        return float(power.min())
    slope, idle = np.polyfit(util / (100.0 if util.max() > 1.5 else 1.0), power, 1)
    return float(min(max(idle, 0.0), power.min())) if slope > 0 else float(power.min())


def _find(doc: object, name: str) -> object:
    """``name``'s value anywhere in a JSON document (vLLM nests it: ``cache_config``)."""
    if isinstance(doc, dict):
        if name in doc:
            return doc[name]
        for value in doc.values():
            found = _find(value, name)
            if found is not None:
                return found
    return None


def _setting(configs: pl.DataFrame, name: str) -> int | None:
    """An engine setting from the engines' configuration (the first that has it)."""
    for text in configs[c.CONFIG_JSON].drop_nulls().to_list() if configs.height else []:
        try:
            return int(float(_find(json.loads(text), name)))  # type: ignore[arg-type]
        except (ValueError, TypeError):
            continue
    return None


def calibrate(row: dict, requests: pl.DataFrame, kv_capacity: float | None,
              configs: pl.DataFrame, gpu_samples: pl.DataFrame, engines: int,
              config: AnalyticsConfig) -> Calibration:
    """The twin of the pool of `capacity` row ``row`` (module docstring) from its requests,
    its engines' KV capacity (tokens), configuration rows and GPU samples."""
    notes = []
    base, per_token, prompt = _prefill(requests)
    output = float(requests[c.OUTPUT_TOKENS].mean() or 1.0)
    measured = request_steps(requests, config.window_s)
    hinge = row.get(c.STEP_HINGE_BATCH)
    if measured is None:
        step_base, slope = float(row[c.STEP_BASE_S]), float(row[c.STEP_PER_SEQ_S] or 0.0)
        per_kv, above = float(row[c.STEP_PER_KV_TOKEN_S] or 0.0), row.get(
            c.STEP_PER_SEQ_ABOVE_S)
        outside: tuple[float, ...] = ()
        decode_scale: tuple[float, ...] = ()
        by_state: dict = {}
    else:  # the batch each request decoded in is known: no KV term or hinge beside it
        step_base, slope, per_kv, above, hinge = (measured.base_s, measured.per_seq_s, 0.0,
                                                  0.0, None)
        outside = tuple(float(v) for v in measured.outside_s)
        decode_scale = tuple(float(v) for v in measured.decode_scale)
        by_state = {"outside_idle_s": tuple(float(v) for v in measured.outside_idle_s),
                    "outside_busy_s": tuple(float(v) for v in measured.outside_busy_s),
                    "found_idle": tuple(bool(v) for v in measured.idle),
                    "p_idle": measured.p_idle}
        notes.append(
            f"decode step from {measured.requests} requests' own timings: "
            f"{step_base * 1e3:.2f} ms + {slope * 1e3:.3f} ms per sequence"
            + (f" (+-{measured.per_seq_se_s * 1e3:.3f})" if slope else
               " (no slope told from none)")
            + f", measured up to batch {measured.seen_max:.1f}: past it extrapolated; "
            f"time outside the engine from "
            + ("the requests that found it idle" if measured.outside_from_idle else
               "all requests less half a step"))
    # the prompts' time per running sequence per decode step (module docstring)
    carried = max(base + per_token * prompt - step_base, 0.0) / max(output, 1.0)
    per_seq = max(slope - carried, 0.0)
    tp = int(row[c.TP] or 1)
    configured = _setting(configs, "num_gpu_blocks")
    if kv_capacity:
        blocks = int(kv_capacity // BLOCK_TOKENS)
    elif configured:
        blocks = configured * (_setting(configs, "block_size") or BLOCK_TOKENS) // BLOCK_TOKENS
    else:
        blocks = _blocks_from_shape(row[c.MODEL], row[c.GPU_MODEL], tp, config)
        notes.append("KV capacity not reported: " + ("from the model shape" if blocks
                                                      else "taken as unlimited"))
    seqs = _setting(configs, "max_num_seqs")
    budget = _setting(configs, "max_num_batched_tokens")
    if seqs is None or budget is None:
        notes.append(f"engine configuration not reported: vLLM defaults (max_num_seqs "
                     f"{DEFAULT_MAX_NUM_SEQS}, max_num_batched_tokens "
                     f"{DEFAULT_MAX_BATCHED_TOKENS})")
    idle = _idle_power(gpu_samples)
    prefill_scale, wake = (_prefill_scale(requests, base, per_token, measured.idle)
                           if measured is not None else ((), 0.0))
    if wake:
        notes.append(f"an idle engine's first step {wake * 1e3:.2f} ms slower (its wake): "
                     f"added to each step the twin starts from idle")
    return Calibration(
        gpu_model=row[c.GPU_MODEL], tp=tp, engines=engines, base_s=step_base,
        per_seq_s=per_seq, per_kv_s=per_kv,
        hinge=float(hinge) if hinge is not None else float("inf"),
        above_s=float(above or 0.0), prefill_base_s=base,
        prefill_per_token_s=per_token, kv_blocks=blocks or UNLIMITED_BLOCKS,
        max_num_seqs=seqs or DEFAULT_MAX_NUM_SEQS,
        max_batched_tokens=budget or DEFAULT_MAX_BATCHED_TOKENS, idle_w=idle,
        tpot_slo_s=float(row[c.TPOT_SLO_S]), ttft_slo_s=float(row[c.TTFT_SLO_S]),
        notes=tuple(notes), outside_s=outside, decode_scale=decode_scale,
        prefill_scale=prefill_scale, wake_s=wake, **by_state)


def _outside_at(cal: Calibration, factor: float) -> tuple[float, ...]:
    """``cal.outside_s`` for arrivals ``factor`` x as frequent per engine: the share that
    finds its engine idle goes from ``p_idle`` to ``p_idle ** factor`` (Poisson arrivals at
    an engine of many seats), those that found it idle when measured the ones that still do
    (or, at a lower rate, more join them); seeded."""
    if not cal.outside_busy_s or cal.p_idle is None or factor == 1.0:
        return cal.outside_s
    p, idle = cal.p_idle, np.array(cal.found_idle, dtype=bool)
    q = p ** factor
    u = np.random.default_rng(1).random(idle.size)
    if q <= p:
        stays = idle & (u < (q / p if p > 0 else 0.0))
    else:
        stays = idle | (u < (q - p) / (1.0 - p))
    return tuple(float(v) for v in np.where(stays, cal.outside_idle_s, cal.outside_busy_s))


def _free_bytes(model: str, gpu: str, tp: int, config: AnalyticsConfig) -> float | None:
    shape, mem = model_shape(model, config), memory_gb(gpu)
    if shape is None or mem is None:
        return None
    return (mem * 1e9 * 0.9 - 2e9) * tp - shape.weight_bytes


def _blocks_from_shape(model: str, gpu: str, tp: int, config: AnalyticsConfig) -> int | None:
    free, shape = _free_bytes(model, gpu, tp, config), model_shape(model, config)
    if free is None or shape is None or free <= 0:
        return None
    return int(free // (shape.kv_bytes_per_token * BLOCK_TOKENS))


def changed(cal: Calibration, model: str, what: WhatIf, config: AnalyticsConfig
            ) -> Calibration:
    """``cal`` with ``what`` applied (module docstring).

    Raises:
        ValueError: a GPU count that is not a positive multiple of the TP size, or a GPU
            model whose figures are unknown.
    """
    gpus = what.gpus if what.gpus is not None else cal.engines * cal.tp + what.gpus_delta
    if gpus < cal.tp or gpus % cal.tp:
        raise ValueError(f"gpus: {gpus} GPUs do not make whole engines of tp {cal.tp}")
    out = replace(cal, engines=gpus // cal.tp,
                  max_num_seqs=what.max_num_seqs or cal.max_num_seqs)
    out = replace(out, outside_s=_outside_at(cal, what.rate * cal.engines / out.engines))
    if not what.gpu_model:
        return out
    bw_old, bw_new = hbm_gbps(cal.gpu_model, config), hbm_gbps(what.gpu_model, config)
    fl_old = peak_tflops(cal.gpu_model, config.capacity.peak_tflops)
    fl_new = peak_tflops(what.gpu_model, config.capacity.peak_tflops)
    if not (bw_old and bw_new and fl_old and fl_new):
        raise ValueError(f"gpu_model: no HBM or FLOP/s figures for {what.gpu_model!r} or "
                         f"{cal.gpu_model!r} ([analytics] hbm_gbps, [analytics.capacity] "
                         f"peak_tflops)")
    mem, flop = bw_old / bw_new, fl_old / fl_new
    blocks = cal.kv_blocks
    old, new = (_free_bytes(model, g, cal.tp, config) for g in (cal.gpu_model, what.gpu_model))
    if old and new and old > 0 and cal.kv_blocks != UNLIMITED_BLOCKS:
        blocks = max(int(cal.kv_blocks * new / old), 1)
    return replace(out, gpu_model=what.gpu_model, base_s=cal.base_s * mem,
                   per_seq_s=cal.per_seq_s * mem, per_kv_s=cal.per_kv_s * mem,
                   above_s=cal.above_s * flop, prefill_per_token_s=cal.prefill_per_token_s
                   * flop, kv_blocks=blocks, idle_w=None,
                   notes=(*cal.notes, f"{what.gpu_model}: memory-bound step terms x{mem:.2f} "
                          f"(HBM), prompt compute x{flop:.2f} (FLOP/s); its power is not "
                          f"measured, so no J/token"))
