"""The TTFT limit of the knee judges the load a request queued at, not the window its queue
drained into (a real CPU vLLM's overload: the window after it ran batch 5.6 with TTFT p99
5.0 s, and the knee came at 3.4 against the sweep's 8)."""

from __future__ import annotations

import numpy as np
import polars as pl

from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.capacity.analyse import analyse_capacity
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from tests.analytics.capacity_ramp import NS, T0, Ramp, ramp_tables

#: the overloaded window's batch, and the window after it, where its queue drained
TOP, DRAINED = 40.0, 5.0
QUEUED_S = 5.0


def _drained(ramp: Ramp, per_instance: int) -> Tables:
    """``ramp``'s tables plus ``per_instance`` requests per instance that arrived in the last
    10 s of the ``TOP`` window, waited ``QUEUED_S`` for a seat and decoded in the next."""
    tables = ramp_tables(ramp)
    requests = tables.requests.collect()
    last = len(ramp.batches) - 2  # the TOP window
    step = ramp.step_s(TOP)
    extra = []
    for i in range(ramp.instances):
        for k, at in enumerate(np.linspace(50, 59, per_instance)):
            arrival = T0 + int((last * ramp.window_s + at) * NS)
            decode = step * (ramp.output - 1)
            extra.append({**requests.row(0, named=True), c.REQUEST_ID: f"queued-{i}-{k}",
                          c.INSTANCE_ID: f"chat-h01-{i}", c.ARRIVAL_NS: arrival,
                          c.TTFT_S: QUEUED_S, c.TPOT_S: step, c.DECODE_S: decode,
                          c.END_NS: arrival + int((QUEUED_S + decode) * NS)})
    return Tables.from_frames(pl.concat([requests, pl.DataFrame(extra, schema=requests.schema)]),
                              tables.engine_samples.collect(), tables.gpu_samples.collect(),
                              tables.windows.collect(), tables.instance_gpus)


def test_a_queue_is_judged_at_the_load_it_built_in_not_where_it_drained() -> None:
    # no window of the ramp shares the drained window's batch bin (4.6-7.7 at the default
    # bin width): its TTFT p99 alone would decide that bin
    ramp = Ramp(batches=(1.0, 1.0, 1.0, 1.0, 2.0, 3.0, *np.linspace(12, TOP, 8), DRAINED))
    row = analyse_capacity(_drained(ramp, 30), AnalyticsConfig(), ramp.window_s
                           ).capacity.row(0, named=True)
    # the requests that arrived at batch 40 waited 5 s: the knee is the largest batch
    # visited below that window's bin (35.7-59.5), 32; judged by the drained window it was
    # the largest below 5, 3.4
    assert row[c.KNEE_LIMIT] == "ttft"
    assert 30 <= row[c.KNEE_BATCH] < TOP, row


def test_a_window_that_met_the_slo_inside_the_breaking_bin_counts() -> None:
    """A real vLLM's near-capacity window (batch 5.2, TTFT p99 0.15 s) shared its +-25% bin
    with two of the overload's (7.6 and 7.7: 2.5 and 3.1 s): the bin breaks, but the SLO
    was met at 5.2, below the first window that broke it (the knee was 3.0 here, the
    largest batch below the bin)."""
    from fleetlens.analytics.capacity.knee import Pool, ttft_limit

    batch = np.array([1.0, 1.1, 2.0, 3.0, 5.2, 7.6, 7.7, 6.0])
    ttft = np.array([0.01, 0.01, 0.01, 0.02, 0.15, 2.5, 3.1, np.nan])  # 6.0: no arrivals
    zeros = np.zeros(batch.size)
    pool = Pool(batch, zeros, zeros, zeros, ttft, zeros, np.ones(batch.size, bool), 100.0,
                100.0, 0.01, None)
    assert ttft_limit(pool, 2.0, 0.25) == 5.2
    # at the seat limit a window met it at the batch an overload one broke it at (7.80):
    # the batch does not order the breaks there, the knee is the batch it was met at
    saturated = Pool(np.array([1.0, 2.0, 3.8, 7.801, 7.7997, 8.0]), *(np.zeros(6),) * 3,
                     np.array([0.01, 0.01, 0.26, 0.43, 4.5, 3.1]), np.zeros(6),
                     np.ones(6, bool), 100.0, 100.0, 0.01, None)
    assert ttft_limit(saturated, 2.0, 0.25) == 7.801
    # where the bin's windows all broke, the batch below the bin
    assert ttft_limit(Pool(batch, zeros, zeros, zeros, np.where(batch > 5, 2.5, ttft), zeros,
                           np.ones(batch.size, bool), 100.0, 100.0, 0.01, None),
                      2.0, 0.25) == 3.0


def test_the_seat_limits_windows_share_one_bin_and_a_break_there_caps_the_knee() -> None:
    """A real vLLM at its 8 seats: the overload's last window broke TTFT at batch 7.6 while
    the near-capacity window and the overload's first met it at 7.8 and 8.0. On a grid from
    batch 1 the bin edge at 7.72 put 7.6 alone in a bin that broke, and the knee came out at
    the batch below, 4.1 (the sweep's: 8). Bins centred on the largest batch keep the three
    together; their median meets the SLO, and the break among them caps the knee at the
    largest batch that met it."""
    from fleetlens.analytics.capacity.knee import Pool, ttft_limit

    batch = np.array([1.0, 1.9, 2.2, 4.1, 3.9, 7.8, 8.0, 7.6, 2.0])
    ttft = np.array([0.01, 0.01, 0.01, 0.02, 0.02, 0.24, 1.72, 2.9, np.nan])
    zeros = np.zeros(batch.size)
    pool = Pool(batch, zeros, zeros, zeros, ttft, zeros, np.ones(batch.size, bool), 100.0,
                100.0, 0.01, None)
    assert ttft_limit(pool, 2.0, 0.25) == 8.0
    # no break at all: no TTFT limit
    calm = Pool(batch, zeros, zeros, zeros, np.minimum(ttft, 1.0), zeros,
                np.ones(batch.size, bool), 100.0, 100.0, 0.01, None)
    assert ttft_limit(calm, 2.0, 0.25) == float("inf")
