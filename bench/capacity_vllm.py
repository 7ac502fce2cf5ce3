"""The real-vLLM capacity run judged again offline: the passive knee and the twin on the
telemetry of a kept run of ``tests/agent/test_vllm_capacity.py`` (issue 31).

    python bench/capacity_vllm.py RUN_DIR [RUN_DIR ...] [--workdir DIR]

``RUN_DIR`` is the test's temporary directory (``data/``, ``low/``: the data dir cut to the
low phases, since the test leaves the host's busy seconds out their calm parts, with
``low.toml``; ``fleetlens.toml``, and ``phases.json`` where the run wrote one, with the high
phases' calm parts measured; without it the low phase is taken as the 90 s from the cut's
first sample: the runs before the test shrank).
Both data dirs are copied under ``DIR`` and re-analysed there (``fleetlens analyze``: the
capacity stage from the stored tables, so a changed estimator is judged on the same
telemetry), then ``fleetlens capacity`` and ``--what-if rate=K,max_num_seqs=8`` on the low
cut (K: the high phase's rate over the low's; 2.4 before ``phases.json``), against the high
phase as the pipeline measured it (its first seconds left out, as the test does). Prints
one JSON line per run: the passive knee, the fit, goodput, and each figure's error for the
twin's present and its what-if. Reads a few MB; seconds per run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.schema import tables as t  # noqa: E402
from fleetlens.pipeline.storage import DataDir, scan  # noqa: E402
from tests.agent.capacity_run import NS, capacity_rows, cli  # noqa: E402

FIGURES = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
#: the test's phases before it wrote phases.json: low 90 s, then high 40 s at 2.4x its
#: rate, measured after 10 s
LOW_S, HIGH_S, SETTLE_S, FACTOR, SEATS = 90, 40, 10, 2.4, 8
KEYS = ("knee_batch", "knee_limit", "knee_batch_lo", "knee_batch_hi", "step_base_s",
        "step_per_seq_s", "step_hinge_batch", "fit_r2", "goodput_rps_per_gpu",
        "goodput_now_rps_per_gpu")


def _phases(run: Path, low: DataDir) -> tuple[tuple[int, int], list[tuple[int, int]], float]:
    """(the low phases' first start and last end, the high phases' measured parts, the rate
    factor) in ns."""
    phases = run / "phases.json"
    if phases.exists():
        from tests.agent.test_vllm_capacity import SETTLE_S as settle
        from tests.agent.test_vllm_capacity import _of

        doc = json.loads(phases.read_text())
        low, high = _of(doc["phases"], "low"), _of(doc["phases"], "high")
        rates = {k.rstrip("0123456789"): v for k, v in doc["rates"].items()}
        # since the test leaves the host's busy seconds out, their calm parts
        measured = ([tuple(s) for s in doc["calm_high"]] if "calm_high" in doc
                    else [(lo + int(settle * NS), hi) for lo, hi in high])
        return (low[0][0], low[-1][1]), measured, rates["high"] / rates["low"]
    first = min(int(pl.read_parquet(p, columns=["ts_ns"])["ts_ns"].min())
                for p in (low.root / "raw").rglob("*.parquet")
                if "ts_ns" in pl.read_parquet_schema(p))
    hi = first + LOW_S * NS
    return (first, hi), [(hi + SETTLE_S * NS, hi + HIGH_S * NS)], FACTOR


def _measured(data: DataDir, spans: list[tuple[int, int]]) -> dict:
    arrived = pl.any_horizontal([pl.col(c.ARRIVAL_NS).is_between(lo, hi, closed="left")
                                 for lo, hi in spans])
    rows = (scan(data, t.REQUESTS).filter(arrived & ~pl.col(c.IS_ERROR).fill_null(False))
            .select(c.TTFT_S, c.TPOT_S).collect())
    return {f"{col[:-2]}_p{int(q * 100)}_s": rows[col].quantile(q, "linear")
            for col in (c.TTFT_S, c.TPOT_S) for q in (0.5, 0.9)}


def judge(run: Path, work: Path) -> dict:
    """One kept run judged again (module docstring)."""
    if work.exists():
        shutil.rmtree(work)
    for name in ("data", "low"):
        shutil.copytree(run / name, work / name)
    config = run / "fleetlens.toml"
    # the cut's own configuration where the test wrote one (fewer windows for its knee)
    low_config = run / "low.toml" if (run / "low.toml").exists() else config
    data, low = DataDir(work / "data"), DataDir(work / "low")
    (lo, hi), high_spans, factor = _phases(run, low)
    for where, conf in ((data, config), (low, low_config)):
        cli("analyze", "--data-dir", str(where.root), "--config", str(conf))
    passive = capacity_rows(data, config)[0]
    calibrated = capacity_rows(low, low_config)[0]
    twin = {r["row"]: r for r in capacity_rows(
        low, low_config, "--what-if", f"rate={factor:.4g},max_num_seqs={SEATS}", "--hours",
        f"{(hi - lo) / NS / 3600:.6f}")}
    high = _measured(data, high_spans)

    def errors(row: dict, against: dict) -> dict:
        return {f: round(row[f] / against[f] - 1, 3) for f in FIGURES
                if row.get(f) is not None and against.get(f)}

    return {"run": str(run), "passive": {k: passive.get(k) for k in KEYS},
            "calibrated": {k: calibrated.get(k) for k in KEYS},
            "present_error": errors(twin["twin (present)"], twin["measured"]),
            "what_if_error": errors(twin["twin (what-if)"], high),
            "high_measured_ms": {f: round(v * 1e3, 2) for f, v in high.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fleetlens-capacity-vllm"))
    args = parser.parse_args()
    for i, run in enumerate(args.runs):
        print(json.dumps(judge(run, args.workdir / f"run{i}"), default=str), flush=True)


if __name__ == "__main__":
    main()
