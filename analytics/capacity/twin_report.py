"""The twin's figures, and the measured present's, in one shape (issue 31 item 5).

For a set of requests over ``seconds`` on ``gpus`` GPUs: TTFT and TPOT p50/p90 (TTFT: arrival
to first token; TPOT: first token to last / (output tokens - 1)), SLO attainment (the share
of the requests meeting the pool's TPOT and TTFT SLOs of the `capacity` row; a request the
twin had not finished when it stopped counts as missing them), goodput (requests meeting
both SLOs per second per GPU, DistServe's definition) and J/token (GPU energy over output
tokens; the twin's energy: each GPU ``idle_w`` the whole time plus ``busy_w - idle_w`` while
its engine steps, ``busy_w`` set so that the twin's replay of the present spends the measured
energy: its J/token on the present is the measured one by construction).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from fleetlens.pipeline.schema import columns as c

#: the rows of a what-if report, in order
MEASURED, TWIN_PRESENT, TWIN_WHAT_IF = "measured", "twin (present)", "twin (what-if)"
TTFT50, TTFT90 = c.percentile_column("ttft", "p50"), c.percentile_column("ttft", "p90")
TPOT50, TPOT90 = c.percentile_column("tpot", "p50"), c.percentile_column("tpot", "p90")
ATTAINMENT = "slo_attainment"
FIGURES = (c.REQUESTS, TTFT50, TTFT90, TPOT50, TPOT90, ATTAINMENT, c.GOODPUT_RPS_PER_GPU,
           c.J_PER_TOKEN)


def figures(latencies: pl.DataFrame, unfinished: int, seconds: float, gpus: int,
            energy_j: float | None, tpot_slo_s: float, ttft_slo_s: float) -> dict:
    """The figures (module docstring) of ``latencies`` (``ttft_s``, ``tpot_s``,
    ``output_tokens`` per request)."""
    def pct(col: str, q: float) -> float | None:
        values = latencies[col].drop_nulls().to_numpy()
        return float(np.quantile(values, q)) if values.size else None

    good = int(latencies.select(((pl.col(c.TPOT_S).is_null()
                                  | (pl.col(c.TPOT_S) <= tpot_slo_s))
                                 & (pl.col(c.TTFT_S) <= ttft_slo_s)).sum()).item() or 0)
    total = latencies.height + unfinished
    tokens = float(latencies[c.OUTPUT_TOKENS].sum() or 0)
    return {c.REQUESTS: total, TTFT50: pct(c.TTFT_S, 0.5), TTFT90: pct(c.TTFT_S, 0.9),
            TPOT50: pct(c.TPOT_S, 0.5), TPOT90: pct(c.TPOT_S, 0.9),
            ATTAINMENT: good / total if total else None,
            c.GOODPUT_RPS_PER_GPU: good / seconds / gpus if seconds > 0 and gpus else None,
            c.J_PER_TOKEN: energy_j / tokens if energy_j is not None and tokens else None}


def busy_power(measured_j: float | None, idle_w: float | None, gpus: int, seconds: float,
               tp: int, busy_s: list[float]) -> float | None:
    """The power per GPU while its engine steps, W, such that the twin's replay of the
    present (``busy_s`` per engine) spends the measured energy: ``idle_w`` all the time on
    every GPU plus the rest over the engines' stepping time. NVML's utilisation counts
    kernels only, not the CPU's share of each step, so a line of power on utilisation
    would put the twin's stepping time at the wrong price (+19% J/token on a simulated
    fleet)."""
    stepping = tp * sum(busy_s)
    if measured_j is None or idle_w is None or stepping <= 0:
        return None
    return idle_w + max(measured_j - idle_w * gpus * seconds, 0.0) / stepping


def twin_energy(busy_s: list[float], seconds: float, tp: int, idle_w: float | None,
                busy_w: float | None) -> float | None:
    """The twin's GPU energy, J: per engine, ``tp`` GPUs at ``idle_w`` over the period (or
    as long as the engine stepped, if longer) plus ``busy_w - idle_w`` while it stepped."""
    if idle_w is None or busy_w is None:
        return None
    return float(sum(tp * (idle_w * max(seconds, b) + (busy_w - idle_w) * b) for b in busy_s))


#: the issue's accuracy bound for the twin (TTFT and TPOT p50/p90 within 20%), applied to
#: its replay of the period it was calibrated on
PRESENT_MARGIN = 0.20


def present_errors(measured: dict, present: dict) -> dict[str, float]:
    """The twin's relative error on the present (same arrivals, nothing changed), per
    TTFT and TPOT p50/p90 that both rows have."""
    out = {}
    for key, name in ((TTFT50, "TTFT p50"), (TTFT90, "TTFT p90"), (TPOT50, "TPOT p50"),
                      (TPOT90, "TPOT p90")):
        if measured[key] and present[key] is not None:
            out[name] = present[key] / measured[key] - 1
    return out


#: In ``--format json/csv`` rows: whether the twin's replay of the present is within
#: :data:`PRESENT_MARGIN` on every latency it could compare (the table says NOT VALIDATED).
VALIDATED = "twin_validated"


def off_present(measured: dict, present: dict) -> list[str]:
    """The latencies the twin's replay of the present misses by more than the margin."""
    return [name for name, e in present_errors(measured, present).items()
            if abs(e) > PRESENT_MARGIN]


def report_table(pool: str, rows: list[dict], notes: list[str]) -> str:
    """A pool's measured present, the twin's present and the what-if, one line each, and
    the twin's error on the present (the same arrivals, nothing changed)."""
    def num(v: float | None, scale: float, fmt: str) -> str:
        return "-" if v is None else format(v * scale, fmt)

    lines = [pool, f"  {'':16}{'requests':>9}{'TTFT p50/p90 ms':>18}{'TPOT p50/p90 ms':>17}"
                   f"{'SLO met':>9}{'good/s/GPU':>11}{'J/token':>9}"]
    for row in rows:
        lines.append(
            f"  {row['row']:16}{row[c.REQUESTS]:>9}"
            f"{num(row[TTFT50], 1e3, '.0f') + '/' + num(row[TTFT90], 1e3, '.0f'):>18}"
            f"{num(row[TPOT50], 1e3, '.1f') + '/' + num(row[TPOT90], 1e3, '.1f'):>17}"
            f"{num(row[ATTAINMENT], 100, '.1f') + '%':>9}"
            f"{num(row[c.GOODPUT_RPS_PER_GPU], 1, '.3f'):>11}"
            f"{num(row[c.J_PER_TOKEN], 1, '.3f'):>9}")
    lines.append("  what-if: " + rows[-1]["what_if"])
    errors = present_errors(rows[0], rows[1])
    if errors:
        lines.append("  the twin's own error on the present: " + ", ".join(
            f"{name} {e:+.0%}" for name, e in errors.items()))
    off = off_present(rows[0], rows[1])
    if off:  # the twin validates itself on the period it was calibrated on
        lines.append(f"  NOT VALIDATED: the twin's replay of the present misses "
                     f"{', '.join(off)} by more than {PRESENT_MARGIN:.0%}, so its what-if "
                     f"is not validated either")
    lines += [f"  note: {n}" for n in notes]
    return "\n".join(lines)
