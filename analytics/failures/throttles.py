"""GPUs throttling by heat, from `gpu_samples`: a hardware warning even when no latency moved.

A GPU whose thermal clock-event reasons stay set for ``throttle_after_s`` runs slower than it
can because its cooling cannot keep up (a failed fan, a hot aisle, a clogged filter): today
it may cost nothing, under the next surge it costs tokens per second. Samples of one GPU
whose thermal bits are set within ``together_ns`` of each other are one spell (a throttling
GPU flickers as its clock recovers and falls again). The power cap (0x4) is no warning: a
healthy GPU at full load sits at its power limit.

A latency incident that already names the throttle takes the warning into its cause's
evidence (:mod:`.absorb`): one story, not a warning beside its own incident.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.failures.findings import LEVEL_HOST, Finding
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000
#: NVML clocks event reasons that mean heat (nvmlClocksEventReason*; DCGM's
#: DCGM_CLOCKS_EVENT_REASON_* use the same bits). HW slowdown is also raised by an external
#: power brake, but a GPU halving its clock for a minute is worth a warning either way.
THERMAL_REASONS = {0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown"}
THERMAL_MASK = sum(THERMAL_REASONS)
_IDLE = 0x1  # nvmlClocksEventReasonGpuIdle: the idle clock is no clock to compare
#: How far back the GPU's own clock before a spell is read (its unthrottled busy samples).
BEFORE_NS = 600 * NS


def _reasons() -> pl.Expr:
    return pl.col(c.CLOCKS_EVENT_REASONS).fill_null(0)


def thermal_throttles(gpu_samples: pl.LazyFrame, gpu_services: dict[str, str],
                      together_ns: int, cfg: FailureConfig) -> list[Finding]:
    """One warning per spell of a GPU's thermal reasons lasting ``cfg.throttle_after_s``;
    ``gpu_services``: the service of the engine on each GPU."""
    hot = (gpu_samples.filter((_reasons() & THERMAL_MASK) > 0)
           .select(c.TS_NS, c.HOST_NAME, c.GPU_INDEX, c.GPU_UUID, c.CLOCKS_EVENT_REASONS)
           .sort(c.GPU_UUID, c.TS_NS).collect())
    if hot.is_empty():
        return []
    gap = pl.col(c.TS_NS) - pl.col(c.TS_NS).shift(1).over(c.GPU_UUID)
    spells = (hot.with_columns((gap > together_ns).fill_null(True).cum_sum().over(c.GPU_UUID)
                               .alias("_spell"))
              .group_by(c.GPU_UUID, "_spell", maintain_order=True).agg(
                  pl.col(c.TS_NS).min().alias("_start"), pl.col(c.TS_NS).max().alias("_end"),
                  pl.col(c.HOST_NAME).first(), pl.col(c.GPU_INDEX).first(),
                  *[((_reasons() & bit) > 0).any().alias(name)
                    for bit, name in THERMAL_REASONS.items()])
              .filter(pl.col("_end") - pl.col("_start") >= int(cfg.throttle_after_s * NS)))
    if spells.is_empty():
        return []
    # the spells' GPUs around them: their temperatures and clocks, before and during
    context = (gpu_samples.filter(
        pl.col(c.GPU_UUID).is_in(spells.get_column(c.GPU_UUID).unique().to_list())
        & pl.col(c.TS_NS).is_between(int(spells["_start"].min()) - BEFORE_NS,
                                     int(spells["_end"].max()) + together_ns))
        .select(c.TS_NS, c.GPU_UUID, c.CLOCKS_EVENT_REASONS, c.TEMP_C, c.SM_CLOCK_MHZ)
        .collect())
    # a spell is over once its GPU reported for longer than the merge gap without heat
    last_of = dict(gpu_samples.group_by(c.GPU_UUID).agg(pl.col(c.TS_NS).max()).collect()
                   .iter_rows())
    return _per_host([_finding(row, context.filter(pl.col(c.GPU_UUID) == row[c.GPU_UUID]),
                               gpu_services,
                               last_of.get(row[c.GPU_UUID], 0) - row["_end"] <= together_ns,
                               cfg) for row in spells.iter_rows(named=True)])


def _per_host(found: list[Finding]) -> list[Finding]:
    """GPUs of one host (and service) hot at once are one warning, the host's: a hot aisle
    or a failed fan heats them together (each GPU's figures stay in ``per_gpu``)."""
    groups: list[list[Finding]] = []
    for f in sorted(found, key=lambda f: (f.host, f.service, f.start_ns)):
        last = groups[-1] if groups else []
        if last and (last[0].host, last[0].service) == (f.host, f.service) \
                and f.start_ns <= max(g.end_ns for g in last):
            last.append(f)
        else:
            groups.append([f])
    out = []
    for spell in groups:
        first = spell[0]
        if len(spell) == 1:
            out.append(first)
            continue
        hottest = max(spell, key=lambda f: f.peak)
        out.append(Finding(
            first.cause, subject(c.HOST_NAME, first.host), first.service, "", first.host,
            first.start_ns, max(f.end_ns for f in spell), min(f.detected_ns for f in spell),
            first.metric, hottest.peak, hottest.expected,
            f"{len(spell)} GPUs of {first.host}: " + "; ".join(f.summary for f in spell),
            LEVEL_HOST, {**hottest.evidence, c.GPU_UUID: None,
                         "gpus": sorted(g for f in spell for g in f.evidence["gpus"]),
                         "per_gpu": [f.evidence for f in spell]}))
    return out


def _median(frame: pl.DataFrame, column: str) -> float | None:
    value = frame.get_column(column).drop_nulls().median() if frame.height else None
    return None if value is None else round(float(value), 1)


def _finding(spell: dict, samples: pl.DataFrame, gpu_services: dict[str, str], ongoing: bool,
             cfg: FailureConfig) -> Finding:
    gpu, host, start, end = spell[c.GPU_UUID], spell[c.HOST_NAME], spell["_start"], spell["_end"]
    busy = (_reasons() & _IDLE) == 0
    during = samples.filter(pl.col(c.TS_NS).is_between(start, end))
    before = samples.filter(pl.col(c.TS_NS).is_between(start - BEFORE_NS, start, closed="left")
                            & busy & ((_reasons() & THERMAL_MASK) == 0))
    clock, clock_before = _median(during.filter(busy), c.SM_CLOCK_MHZ), _median(
        before, c.SM_CLOCK_MHZ)
    peak = during.get_column(c.TEMP_C).max() if during.height else None
    peak = None if peak is None else round(float(peak), 1)
    drop = (round(1 - clock / clock_before, 3) if clock is not None and clock_before
            else None)
    seconds = (end - start) / NS
    reasons = [name for name in THERMAL_REASONS.values() if spell[name]]
    where = f"{host}:{spell[c.GPU_INDEX]}" if spell[c.GPU_INDEX] is not None else host
    clocks = (f"SM clock {clock_before:.0f} -> {clock:.0f} MHz ({-drop:+.0%})"
              if drop is not None else
              f"SM clock {clock:.0f} MHz" if clock is not None else "SM clock unknown")
    summary = (f"GPU {gpu} ({where}) throttled by heat for {seconds:.0f} s"
               + (f" at up to {peak:.0f} C" if peak is not None else "")
               + f" ({', '.join(reasons)}): {clocks}" + (" (still)" if ongoing else ""))
    evidence = {"reasons": reasons, "peak_temp_c": peak, c.SM_CLOCK_MHZ: clock,
                "sm_clock_before_mhz": clock_before, "clock_drop": drop,
                "throttled_s": seconds, "thermal_share": _share(during), "ongoing": ongoing,
                c.GPU_UUID: gpu, c.GPU_INDEX: spell[c.GPU_INDEX], "gpus": [gpu]}
    return Finding(Cause.THERMAL_THROTTLE, subject(c.GPU_UUID, gpu),
                   gpu_services.get(gpu, FLEET_WIDE), "", host, start, end,
                   start + int(cfg.throttle_after_s * NS), c.TEMP_C,
                   peak if peak is not None else 0.0, _median(before, c.TEMP_C), summary,
                   LEVEL_HOST, evidence)


def _share(samples: pl.DataFrame) -> float | None:
    """The share of samples with a thermal reason set (a steady throttle is 1)."""
    if samples.is_empty():
        return None
    return round(float(samples.select(((_reasons() & THERMAL_MASK) > 0).mean()).item()), 3)
