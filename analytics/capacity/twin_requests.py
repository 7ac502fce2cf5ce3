"""The twin's decode step and the time outside the engine, measured on the pool's requests
themselves (issue 31 item 5): each request's engine timings (``queue_s``, ``prefill_s``,
``decode_s``) place it on its engine's timeline, so the batch it decoded in and whether its
engine was idle when it came are known per request, not only per window.

- the batch a request decoded in (``seen``): the time average, over its decode (first token
  to last), of its engine's requests between their scheduling and their last token (itself
  included). That is the batch the twin's engine steps with, where a window's
  ``num_requests_running`` mean also counts the idle time between requests (at a low rate
  a request decodes beside about one more than the window's mean);
- the decode step ``tpot = base + per_seq x seen`` by two-stage least squares with the
  request's arrivals as instrument: the arrivals on its engine within a request's median
  lifetime either side of its own. The instrument is needed because the batch also follows
  the step time: while the host is slow every request lasts longer, so more of them overlap
  (Little's law), and a plain fit draws a slope from the host's noise (on a real CPU vLLM
  at batches 1-3: 0.27-0.36 ms per sequence where the arrivals explain -0.04 to 0.20). Open-
  loop arrivals do not follow the engine's speed. The slope is kept only where it is told
  from none at :data:`ALPHA`, and never negative, else the step is flat at the mean TPOT;
- the host's own variation (``decode_scale``): each request's TPOT over the line's at its
  batch. The line is a mean; a twin stepping at it has no spread, where a real host's
  steps vary (on a CPU vLLM TPOT p90 was 1.3x p50 at batches 1-3), so the twin's steps run
  as slow as the requests they carry did, the host's slower spells included: the twin runs
  on the host it was calibrated on. (Each window's level was once set to the windows'
  median, a spell being an event of the period: then a real vLLM's rates, interleaved
  window by window so both met the same host, were predicted TPOT p90 -8.5% and TTFT p90
  -8.9%, kept +2.7% and -5.6%; the spell that had been carried, +31%, came from a
  calibration phase before a calmer measured one);
- the time outside the engine (``outside_s``): TTFT less the engine's queue and prefill, i.e.
  the API server's tokenising and hand-over, the wait for the engine's step in progress, and
  the first token's way back. Requests that found their engine idle waited for no step, so
  theirs is the time the twin adds to its own engine's (which simulates that wait); with too
  few of them, every request's less half the median TPOT (the mean wait for a step). Those
  that found it busy spent more than that wait besides (on a CPU vLLM the API server shares
  the core with the stepping engine: their outside time's p90 was 2.4-2.8 ms over the idle
  arrivals', a step's wait at most 2 ms), so they draw from their own time before their
  prefill (TTFT - prefill: an engine may count the step's wait in its queue, as the
  simulator's does), less half the median TPOT (the mean wait for the step, which the twin
  simulates), those that waited for a seat left out; taking the idle arrivals' for all put
  the twin's TTFT - prefill p90 at 4.9 ms against 5.8 measured at twice the rate. A what-if
  at another rate per engine finds the engine idle as often as Poisson arrivals find an
  engine of many seats (M/G/inf): ``p_idle ** (rate per engine x)``, the arrivals that
  found it idle at the low rate the ones that still do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from fleetlens.analytics.capacity.fit import ALPHA, t_critical
from fleetlens.pipeline.schema import columns as c

#: fewest requests with engine timings a per-request calibration needs
MIN_REQUESTS = 30
#: fewest idle arrivals whose outside time stands for all (else every request's, less a wait)
MIN_IDLE = 20
#: an instrument correlating less than this with the batch is too weak to tell a slope
MIN_INSTRUMENT_CORR = 0.3
_TIMED = (c.ARRIVAL_NS, c.TTFT_S, c.QUEUE_S, c.PREFILL_S, c.DECODE_S, c.OUTPUT_TOKENS)


@dataclass(frozen=True)
class RequestSteps:
    """The decode step and outside time measured on the requests (module docstring)."""

    base_s: float
    per_seq_s: float
    per_seq_se_s: float  # the slope's standard error (0 when flat)
    seen_max: float  # the largest batch a request decoded in (p95): past it, extrapolated
    requests: int
    outside_s: np.ndarray  # per request of the frame given (arrival order), s
    outside_from_idle: bool
    #: per request of the frame: a draw of the time outside of an arrival that finds the
    #: engine idle, and of one that finds it busy (module docstring); ``outside_s`` is the
    #: one of what the request found
    outside_idle_s: np.ndarray
    outside_busy_s: np.ndarray
    #: the share of the timed requests that found their engine idle
    p_idle: float
    #: per request of the frame: its TPOT over the line's at the batch it decoded in (1
    #: where not timed): the host's own variation, which the twin's steps keep
    decode_scale: np.ndarray
    #: per request of the frame: it found its engine idle (False where not timed)
    idle: np.ndarray


def _timeline(frame: pl.DataFrame) -> tuple[np.ndarray, ...]:
    """(arrival, scheduled, first token, last token) in s, of one engine's requests."""
    arrival = frame[c.ARRIVAL_NS].to_numpy().astype(float) / 1e9
    first = arrival + frame[c.TTFT_S].to_numpy()
    return arrival, first - frame[c.PREFILL_S].to_numpy(), first, \
        first + frame[c.DECODE_S].to_numpy()


def _running(start: np.ndarray, end: np.ndarray):  # noqa: ANN202
    """The count of ``[start, end)`` intervals as a step function: (its change times, the
    count from each on, its integral up to each)."""
    times = np.concatenate([start, end])
    steps = np.concatenate([np.ones_like(start), -np.ones_like(end)])
    order = np.argsort(times, kind="stable")
    times, count = times[order], np.cumsum(steps[order])
    area = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(times))])
    return times, count, area


def _integral(at: np.ndarray, times: np.ndarray, count: np.ndarray, area: np.ndarray
              ) -> np.ndarray:
    i = np.searchsorted(times, at, side="right") - 1
    inside = i >= 0
    out = np.zeros_like(at)
    out[inside] = area[i[inside]] + count[i[inside]] * (at[inside] - times[i[inside]])
    return out


def _per_engine(frame: pl.DataFrame) -> pl.DataFrame:
    """``seen``, ``idle`` (nothing running at arrival) and the instrument of each request."""
    arrival, sched, first, last = _timeline(frame)
    times, count, area = _running(sched, last)
    span = np.maximum(last - first, 1e-9)
    seen = (_integral(last, times, count, area) - _integral(first, times, count, area)) / span
    at = np.searchsorted(times, arrival, side="right") - 1
    busy = np.where(at >= 0, count[np.maximum(at, 0)], 0)
    life = float(np.median(last - arrival))
    ordered = np.sort(arrival)
    near = (np.searchsorted(ordered, arrival + life) - np.searchsorted(ordered, arrival - life)
            - 1)
    return frame.with_columns(pl.Series("seen", seen), pl.Series("idle", busy <= 0),
                              pl.Series("near", near.astype(float)))


def _iv_line(seen: np.ndarray, tpot: np.ndarray, near: np.ndarray, cluster: np.ndarray
             ) -> tuple[float, float, float]:
    """(base, slope, slope's standard error) by two-stage least squares (module docstring);
    the flat mean where the instrument is weak or the slope not significant or negative.
    The error is clustered by ``cluster`` (the analytics window each request arrived in):
    a host's slow spell slows every request of it alike, so requests are not independent
    draws, and a per-request error told slopes from the host's spells of 10 s."""
    flat = (float(np.mean(tpot)), 0.0, 0.0)
    groups = np.unique(cluster)
    if np.ptp(near) <= 0 or np.ptp(seen) <= 0 or groups.size < 3:
        return flat
    corr = float(np.corrcoef(near, seen)[0, 1])
    if corr < MIN_INSTRUMENT_CORR:
        return flat
    dz = near - near.mean()
    slope = float(np.sum(dz * tpot) / np.sum(dz * seen))
    base = float(np.mean(tpot) - slope * np.mean(seen))
    # the estimator's influence per request, summed per cluster (cluster-robust variance)
    influence = dz * (tpot - base - slope * seen) / np.sum(dz * seen)
    per_group = np.bincount(np.searchsorted(groups, cluster), weights=influence)
    g = groups.size
    se = float(np.sqrt(np.sum(per_group ** 2) * g / (g - 1)))
    if slope <= 0 or slope < t_critical(ALPHA, g - 1) * se:
        return flat
    return base, slope, se


def request_steps(requests: pl.DataFrame, window_s: float) -> RequestSteps | None:
    """The per-request calibration of ``requests`` (arrival order, errors left out; the
    pool's ``instance_id`` column tells its engines apart; ``window_s``: the analytics
    window, the clusters of the slope's error), or None where fewer than
    :data:`MIN_REQUESTS` carry the engine's timings."""
    if any(col not in requests.columns for col in _TIMED):
        return None
    key = c.INSTANCE_ID if c.INSTANCE_ID in requests.columns else None
    timed = requests.with_row_index("_row").filter(
        pl.all_horizontal([pl.col(col).is_not_null() for col in _TIMED])
        & (pl.col(c.OUTPUT_TOKENS) > 1) & (pl.col(c.DECODE_S) > 0))
    if timed.height < MIN_REQUESTS:
        return None
    parts = ([_per_engine(g) for _, g in timed.group_by(key, maintain_order=True)] if key
             else [_per_engine(timed)])
    done = pl.concat(parts).sort("_row")
    tpot = (done[c.DECODE_S] / (done[c.OUTPUT_TOKENS] - 1)).to_numpy()
    seen = done["seen"].to_numpy()
    window = (done[c.ARRIVAL_NS].to_numpy() // int(window_s * 1e9)).astype(np.int64)
    base, slope, se = _iv_line(seen, tpot, done["near"].to_numpy(), window)
    outside = (done[c.TTFT_S] - done[c.QUEUE_S] - done[c.PREFILL_S]).to_numpy()
    idle = done["idle"].to_numpy()
    from_idle = int(idle.sum()) >= MIN_IDLE
    step = float(np.median(tpot))
    waited = np.maximum(outside - step / 2.0, 0.0)
    pool = np.maximum(outside[idle], 0.0) if from_idle else waited
    # a busy arrival's time before its prefill (the engine's queue too: an engine may count
    # the wait for the step in progress there, as the simulator's does) less the mean wait
    # for that step, which the twin's engine simulates; not those that waited for a seat
    before = (done[c.TTFT_S] - done[c.PREFILL_S]).to_numpy()
    stepped = ~idle & (done[c.QUEUE_S].to_numpy() < step)
    busy_pool = (np.maximum(before[stepped] - step / 2.0, 0.0)
                 if from_idle and int(stepped.sum()) >= MIN_IDLE else pool)
    # each request of the frame draws one of each (fixed seed: the same data, the same twin)
    rng = np.random.default_rng(0)
    draws = rng.choice(pool, size=requests.height)
    busy_draws = rng.choice(busy_pool, size=requests.height)
    scale = np.ones(requests.height)
    scale[done["_row"].to_numpy()] = tpot / np.maximum(base + slope * seen, 1e-9)
    found_idle = np.zeros(requests.height, dtype=bool)
    found_idle[done["_row"].to_numpy()] = idle
    timed = np.zeros(requests.height, dtype=bool)
    timed[done["_row"].to_numpy()] = True
    # an untimed request draws as before: the idle arrivals' time
    outside_s = np.where(timed & ~found_idle, busy_draws, draws)
    return RequestSteps(base, slope, se, float(np.quantile(seen, 0.95)), done.height,
                        outside_s=outside_s, outside_from_idle=from_idle,
                        outside_idle_s=draws, outside_busy_s=busy_draws,
                        p_idle=float(idle.mean()), decode_scale=scale, idle=found_idle)
