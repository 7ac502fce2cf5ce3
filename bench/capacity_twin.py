"""The calibrated twin (issue 31 item 5) validated on the simulator: calibrate on a low-rate
stretch of a simulated fleet, predict TTFT and TPOT p50/p90 at a higher rate with
``fleetlens capacity --what-if rate=K``, and compare with the simulator run at that rate
(other random arrivals, same distributions). The issue's target: within 20%.

    python bench/capacity_twin.py [--minutes 60] [--rate 3] [--factor 3] [--seed 1]
        [--gpu H100-SXM] [--model llama-3.1-8b] [--tp 1]

Prints, per figure, the measured value at the low rate, the twin's replay of that present,
the twin's prediction at the higher rate, the simulator's own at that rate, and the error.
Heavy (two fleets end to end): run it under ``flock /tmp/fleetlens-heavy.lock``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.end_to_end import run_end_to_end  # noqa: E402
from fleetlens.cli import cli  # noqa: E402

FIGURES = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


def fleet(rate: float, minutes: float, seed: int, gpu: str, model: str, tp: int) -> dict:
    """One host of two engines at a steady Poisson ``rate`` (req/s, the whole fleet)."""
    return {
        "fleet": {"name": f"twin{seed}", "start": "2026-01-05T06:00:00Z",
                  "duration_s": int(minutes * 60), "drain_s": 60, "seed": seed,
                  "hosts": [{"prefix": "h", "count": 1, "gpus": 2 * tp, "gpu": gpu}]},
        "deployment": [{"service": "chat", "model": model, "hosts": ["h01"], "tp": tp,
                        "prefix_caching": False}],
        "workload": [{"service": "chat", "rate": rate,
                      "prompt": {"median": 600, "sigma": 0.5, "max": 2400},
                      "output": {"median": 160, "sigma": 0.5, "max": 640}}],
    }


def twin(data: Path, what_if: str, hours: float) -> dict[str, dict]:
    """``fleetlens capacity --what-if`` on ``data``: its rows by kind."""
    out = CliRunner().invoke(cli, ["capacity", "--data-dir", str(data), "--what-if", what_if,
                                   "--hours", str(hours), "--format", "json"])
    if out.exit_code:
        raise RuntimeError(out.output)
    return {row["row"]: row for row in json.loads(out.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=3.0, help="the low rate, req/s")
    parser.add_argument("--factor", type=float, default=3.0, help="the higher rate / the low")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpu", default="H100-SXM")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the fleets here (and reuse them when already there)")
    args = parser.parse_args()
    hours = args.minutes / 60 + 1
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        work = args.workdir or Path(tmp)
        low, high = work / "low", work / "high"
        for path, rate, seed in ((low, args.rate, args.seed),
                                 (high, args.rate * args.factor, args.seed + 1000)):
            if not (path / "data").exists():
                run_end_to_end(fleet(rate, args.minutes, seed, args.gpu, args.model, args.tp),
                               path)
        predicted = twin(low / "data", f"rate={args.factor:g}", hours)
        actual = twin(high / "data", "rate=1", hours)["measured"]
        elapsed = time.perf_counter() - started
    print(f"{args.model} on {args.gpu} tp{args.tp}, 2 engines, {args.minutes:g} min at "
          f"{args.rate:g} req/s (calibration) and at x{args.factor:g}; seed {args.seed}; "
          f"{elapsed:.0f} s")
    print(f"{'figure':14}{'measured low':>14}{'twin low':>10}{'twin high':>11}"
          f"{'sim high':>10}{'error':>8}")
    for name in (*FIGURES, "slo_attainment", "goodput_rps_per_gpu", "j_per_token"):
        m, p, w, a = (predicted["measured"][name], predicted["twin (present)"][name],
                      predicted["twin (what-if)"][name], actual[name])
        error = f"{w / a - 1:+.1%}" if w is not None and a else "-"
        scale = 1e3 if name.endswith("_s") else 1.0
        cells = ["-" if v is None else f"{v * scale:.4g}" for v in (m, p, w, a)]
        print(f"{name:14}{cells[0]:>14}{cells[1]:>10}{cells[2]:>11}{cells[3]:>10}{error:>8}")
    print("(latencies in ms; error: twin high / sim high - 1)")


if __name__ == "__main__":
    main()
