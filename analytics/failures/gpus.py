"""GPU faults from `gpu_health`: Xid errors, uncorrectable ECC errors, row-remap failures
and a GPU that fell off the bus.

Each is a fault of one GPU whatever the latency did (a GPU with Xid 79 kills its engine; an
uncorrectable ECC error corrupts what it computes). Readings of one GPU within
``together_ns`` of each other are one finding; the engines on that GPU that went down with
it are part of the finding (its evidence), not incidents of their own.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.failures.findings import LEVEL_HOST, Finding
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000
#: gpu_health signals (pipeline.health) and the details of them that are faults when they
#: rise: any Xid, an uncorrected ECC error, an uncorrectable or failed row remap.
_RISING = {"xid_errors": "", "ecc_errors": "uncorrected", "remapped_rows": "uncorrectable"}
_REMAP_FAILURE, _LOST = "failure", "lost"


def _events(health: pl.DataFrame) -> pl.DataFrame:
    """One row per reading that is a fault: (host, gpu, ts, what, until)."""
    series = [c.HOST_NAME, c.GPU_UUID, c.SIGNAL, c.DETAIL]
    frame = health.sort(*series, c.TS_NS).with_columns(
        pl.col(c.VALUE).shift(1).over(series).alias("_before"),
        pl.col(c.TS_NS).shift(-1).over(series).alias("_next"))
    rising = pl.lit(False)
    for signal, detail in _RISING.items():
        rising = rising | ((pl.col(c.SIGNAL) == signal)
                           & pl.col(c.DETAIL).str.starts_with(detail))
    # a counter that fell restarted (the agent did): its new value counts
    rose = pl.col(c.VALUE) > pl.when(pl.col("_before") <= pl.col(c.VALUE)).then(
        pl.col("_before")).otherwise(0.0)
    fault = ((rising & rose)
             | ((pl.col(c.SIGNAL) == "remapped_rows") & (pl.col(c.DETAIL) == _REMAP_FAILURE)
                & (pl.col(c.VALUE) > 0))
             | ((pl.col(c.SIGNAL) == _LOST) & (pl.col(c.VALUE) > 0)))
    what = pl.concat_str(pl.col(c.SIGNAL), pl.lit(" "), pl.col(c.DETAIL)).str.strip_chars()
    return (frame.filter(fault)
            .select(c.HOST_NAME, c.GPU_UUID, c.TS_NS, what.alias("_what"),
                    pl.when(pl.col(c.SIGNAL) == _LOST).then(pl.col("_next"))
                    .otherwise(pl.col(c.TS_NS)).alias("_until"))
            .sort(c.HOST_NAME, c.GPU_UUID, c.TS_NS))


def gpu_faults(health: pl.DataFrame, gpu_services: dict[str, str], together_ns: int,
               last_ns: int) -> list[Finding]:
    """Findings of GPU faults; ``gpu_services``: the service of the engine on each GPU,
    ``last_ns``: the end of the data (a GPU lost until then is still lost)."""
    if health.is_empty():
        return []
    out: list[Finding] = []
    spell: list[dict] = []
    for row in _events(health).iter_rows(named=True):
        if spell and (row[c.GPU_UUID] != spell[0][c.GPU_UUID]
                      or row[c.TS_NS] - _end(spell, last_ns) > together_ns):
            out.append(_finding(spell, gpu_services, together_ns, last_ns))
            spell = []
        spell.append(row)
    if spell:
        out.append(_finding(spell, gpu_services, together_ns, last_ns))
    return out


def _end(spell: list[dict], last_ns: int) -> int:
    return max(r["_until"] if r["_until"] is not None else last_ns for r in spell)


def _finding(spell: list[dict], gpu_services: dict[str, str], together_ns: int,
             last_ns: int) -> Finding:
    first, gpu = spell[0], spell[0][c.GPU_UUID]
    start = min(r[c.TS_NS] for r in spell)
    end = max(_end(spell, last_ns), start + together_ns)
    what = sorted({r["_what"] for r in spell})
    lost = any(r["_what"] == _LOST for r in spell)
    summary = (f"GPU {gpu} on {first[c.HOST_NAME]} faulted: " + ", ".join(what)
               + (" (fell off the bus: its engines died with it)" if lost else ""))
    return Finding(Cause.GPU_FAULT, subject(c.GPU_UUID, gpu), gpu_services.get(gpu, FLEET_WIDE),
                   "", first[c.HOST_NAME], start, end, start, "gpu_health", float(len(spell)),
                   0.0, summary, LEVEL_HOST,
                   {"readings": what, "lost": lost, c.GPU_UUID: gpu, "instances": []})


def absorb_engines(faults: list[Finding], engine_found: list[Finding],
                   gpus_of: dict[str, set[str]], together_ns: int) -> list[Finding]:
    """The engine findings left once those of engines on a faulted GPU that began with the
    fault are folded into its evidence (``instances``)."""
    left = []
    for f in engine_found:
        engines = f.evidence.get("instances") or [f.evidence.get(c.INSTANCE_ID)]
        owner = next((g for g in faults if f.cause == Cause.ENGINE_DOWN
                      and abs(f.start_ns - g.start_ns) <= together_ns
                      and any(g.evidence[c.GPU_UUID] in gpus_of.get(e, ()) for e in engines)),
                     None)
        if owner is None:
            left.append(f)
        else:
            owner.evidence["instances"] = sorted({*owner.evidence["instances"], *engines})
    return left
