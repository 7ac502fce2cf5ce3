"""The random accuracy suite: ``bench/accuracy.py --suite random --fleets N --seed S``.

Each fleet is drawn by :func:`simulator.randomfleet.random_fleet` from ``S * 1000 + i``, run
end to end (simulator -> real collector -> pipeline -> analytics) and also run once more,
same seed, without its incidents (the paired control, :mod:`simulator.control`). Only the
incidents that moved a latency metric measurably against the control are scored; the others
are reported as dropped (and a detection near one is not a false incident). The time after
the warm-up that lies outside every incident window (+ grace) is judged clean time, so false
incidents per clean simulated day come from the same runs. The bursts a replayed trace brings
by itself are labelled on the control (:mod:`simulator.natural`): an incident on one that
names ``traffic_surge`` is a true one, not false (and is counted apart); so is one named
``kv_cache_pressure`` on a natural saturation (a cache the workload alone filled until the
engine preempted). The report also prints the false rate with those counted as false.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from bench.end_to_end import run_end_to_end
from fleetlens.analytics.accuracy import Score, score_clean, score_run
from fleetlens.pipeline.schema import columns as c
from fleetlens.simulator import parse_scenario
from fleetlens.simulator import run as simulate
from fleetlens.simulator.control import (
    LatencyProbe,
    Verdict,
    probe_frame,
    probe_from,
    validate,
    without_incidents,
)
from fleetlens.simulator.natural import (
    SATURATION_CAUSE,
    natural_saturations,
    natural_surges,
)
from fleetlens.simulator.randomfleet import WARMUP_S, FleetSize, random_fleet

GRACE_S = 180.0  # as analytics.accuracy.score_run
VERDICTS_FILE = "verdicts.json"
PROBES_FILE = "probes-{}.parquet"  # treated / control latencies, to validate again
NS = 1_000_000_000


@dataclass
class RandomResult:
    """What the random suite measured."""

    score: Score = field(default_factory=Score)
    verdicts: list[Verdict] = field(default_factory=list)
    fleets: list[dict] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def dropped(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.valid]


def clean_seconds(truth: dict, warmup_s: float = WARMUP_S) -> float:
    """Judged time of a run outside every incident window plus grace, seconds."""
    lo = truth[c.START_NS] + warmup_s * NS
    spans = sorted((max(g[c.START_NS], lo), g[c.END_NS] + GRACE_S * NS)
                   for g in truth["incidents"])
    covered, reach = 0.0, lo
    for a, b in spans:
        a = max(a, reach)
        if b > a:
            covered += b - a
            reach = b
    return max(truth[c.END_NS] - lo - covered, 0.0) / NS


def describe(doc: dict) -> str:
    """One line: hosts, GPUs and services of a random fleet."""
    hosts = ", ".join(f"{h['count']}x{h['gpus']} {h['gpu']}" for h in doc["fleet"]["hosts"])
    services = ", ".join(f"{d['service']}={d['model']} tp{d['tp']}" for d in doc["deployment"])
    replay = " +azure replay" if any(w.get("replay") for w in doc["workload"]) else ""
    return f"{hosts}; {services}{replay}; {doc['fleet']['duration_s'] / 3600:.1f} h"


def run_fleet(doc: dict, workdir: Path, clean_control: bool = False
              ) -> tuple[Score, list[Verdict], dict]:
    """One random fleet: the run, its control, validation and score."""
    start_ns = parse_scenario(doc).start_ns
    treated, control = LatencyProbe(start_ns), LatencyProbe(start_ns)
    truth, res, timings = run_end_to_end(doc, workdir / doc["fleet"]["name"], probe=treated)
    started = time.perf_counter()
    control_doc = without_incidents(doc)
    clean = None
    if clean_control:  # the control also runs end to end: a whole clean run of this fleet
        _, clean, _ = run_end_to_end(control_doc, workdir / f"{doc['fleet']['name']}-control",
                                     probe=control)
    else:
        simulate(parse_scenario(control_doc), export=False, probe=control)
    timings["control"] = time.perf_counter() - started
    verdicts = validate(truth, treated, control)
    natural = natural_from(control)
    for name, probe in (("treated", treated), ("control", control)):
        pl.DataFrame(probe_frame(probe)).write_parquet(
            workdir / doc["fleet"]["name"] / PROBES_FILE.format(name))
    # Kept beside the data so --rescore can rerun analytics alone on the same pipeline output.
    (workdir / doc["fleet"]["name"] / VERDICTS_FILE).write_text(json.dumps(
        {"scenario": doc, "truth": truth,
         "verdicts": [dataclasses.asdict(v) for v in verdicts]}, default=str))
    score = score_fleet(truth, verdicts, res.analysis, natural)
    if clean is not None:
        score.add(score_clean(clean.analysis.incidents,
                              max(doc["fleet"]["duration_s"] - WARMUP_S, 0) / 86400,
                              clean.analysis.causes, natural, GRACE_S))
    return score, verdicts, timings


def natural_from(control: LatencyProbe) -> list[dict]:
    """The control run's natural surges and saturations as the scorer takes them, each with
    the cause that is right to name it."""
    return [{"service": n.service, c.START_NS: n.start_ns, c.END_NS: n.end_ns, "cause": n.cause}
            for n in [*natural_surges(control), *natural_saturations(control)]]


def score_fleet(truth: dict, verdicts: list[Verdict], analysis: object,
                natural: Sequence[dict] = ()) -> Score:
    """Score one fleet's analysis against its validated incidents; clean time counted."""
    valid = [g for g, v in zip(truth["incidents"], verdicts, strict=True) if v.valid]
    dropped = [g for g, v in zip(truth["incidents"], verdicts, strict=True) if not v.valid]
    score = score_run(valid, analysis.incidents, analysis.causes, GRACE_S, excused=dropped,
                      natural=natural)
    score.natural_saturations = sum(n["cause"] == SATURATION_CAUSE for n in natural)
    score.natural_surges = len(natural) - score.natural_saturations
    # false incidents in this run's clean time count per clean day too
    score.clean_false_incidents += score.false_incidents
    score.clean_days += clean_seconds(truth) / 86400
    return score


def rescore(keep: Path, config: object | None = None,
            log: Callable[[str], None] = print) -> RandomResult:
    """Rerun analytics alone on the fleets a ``--keep`` run left in ``keep`` and score them.

    The simulator and pipeline outputs are reused, so a change to the analytics rules is
    measured in seconds; control runs and verdicts are those saved by the original run.
    """
    from fleetlens.analytics.config import AnalyticsConfig
    from fleetlens.analytics.runner import run as run_analytics
    from fleetlens.pipeline.storage import DataDir

    out = RandomResult()
    started = time.perf_counter()
    saved = sorted(keep.glob(f"*/{VERDICTS_FILE}"))
    if not saved:
        raise SystemExit(f"no {VERDICTS_FILE} under {keep}: run the suite with --keep first")
    for path in saved:
        doc = json.loads(path.read_text())
        verdicts = [Verdict(**v) for v in doc["verdicts"]]
        probes = [path.parent / PROBES_FILE.format(n) for n in ("treated", "control")]
        natural: list[dict] = []
        if all(p.exists() for p in probes):  # validate again: the rule may have changed
            start = doc["truth"][c.START_NS]
            treated, control = (probe_from(pl.read_parquet(p).to_dict(as_series=False), start)
                                for p in probes)
            verdicts = validate(doc["truth"], treated, control)
            natural = natural_from(control)
        analysed = run_analytics(DataDir(path.parent / "data"), config or AnalyticsConfig(),
                                 notify=False)
        score = score_fleet(doc["truth"], verdicts, analysed.analysis, natural)
        control = path.parent.parent / f"{path.parent.name}-control" / "data"
        if control.is_dir():  # the paired control run end to end (--clean-control)
            clean = run_analytics(DataDir(control), config or AnalyticsConfig(), notify=False)
            duration = doc["scenario"]["fleet"]["duration_s"]
            clean_score = score_clean(clean.analysis.incidents,
                                      max(duration - WARMUP_S, 0) / 86400,
                                      clean.analysis.causes, natural, GRACE_S)
            clean_score.misses = [f"clean control: {m}" for m in clean_score.misses]
            score.add(clean_score)
        out.score.add(score)
        out.verdicts += verdicts
        out.seeds.append(doc["scenario"]["fleet"]["seed"])
        log(f"fleet {path.parent.name}: {describe(doc['scenario'])}: "
            f"recall {score.summary()['recall']:.2f}, top-1 {score.top1}/{score.detected}, "
            f"false {score.false_incidents} + {score.clean_false_incidents - score.false_incidents}"
            f" in the control, natural spikes {score.natural_named} named of "
            f"{score.natural_surges} surges + {score.natural_saturations} saturations")
        for note in score.misses:
            log(f"  {note}")
    out.wall_s = time.perf_counter() - started
    return out


def run_random(fleets: int, seed: int, size: FleetSize, workdir: Path,
               clean_control: bool = False, log: Callable[[str], None] = print
               ) -> RandomResult:
    """Run ``fleets`` random fleets drawn from ``seed``; returns the combined result."""
    out = RandomResult()
    started = time.perf_counter()
    for i in range(fleets):
        fleet_seed = seed * 1000 + i
        doc = random_fleet(fleet_seed, size)
        score, verdicts, timings = run_fleet(doc, workdir, clean_control)
        out.score.add(score)
        out.verdicts += verdicts
        out.seeds.append(fleet_seed)
        kept = sum(v.valid for v in verdicts)
        out.fleets.append({"seed": fleet_seed, "fleet": describe(doc), "incidents": len(verdicts),
                           "kept": kept, **score.summary(),
                           "timings_s": {k: round(v, 1) for k, v in timings.items()}})
        log(f"fleet {fleet_seed}: {describe(doc)}: {kept}/{len(verdicts)} incidents kept, "
            f"recall {score.summary()['recall']:.2f}, top-1 {score.top1}/{score.detected}, "
            f"false {score.false_incidents} in the run, {score.clean_false_incidents} in "
            f"{score.clean_days:.3f} clean days, "
            f"{ {k: round(v) for k, v in timings.items()} }")
        for note in score.misses:
            log(f"  {note}")
    out.wall_s = time.perf_counter() - started
    return out


def confusion_table(score: Score) -> str:
    """Rows: injected cause; columns: the top-1 cause named (or missed)."""
    rows = sorted({t for t, _ in score.confusion})
    cols = sorted({p for _, p in score.confusion} - {"missed", "none"}) + [
        p for p in ("none", "missed") if any(q == p for _, q in score.confusion)]
    short = {col: "".join(w[0] for w in col.split("_")) for col in cols}
    lines = [f"{'injected / top-1':>20} " + " ".join(f"{short[c]:>4}" for c in cols)]
    for r in rows:
        lines.append(f"{r:>20} " + " ".join(f"{score.confusion.get((r, c), 0) or '.':>4}"
                                          for c in cols))
    lines.append("columns: " + ", ".join(f"{short[c]}={c}" for c in cols))
    return "\n".join(lines)


def report(result: RandomResult) -> str:
    """The figures the issue asks for, as text."""
    s = result.score.summary()
    delays = result.score.delays_s
    lines = [f"fleets: {len(result.seeds)} (seeds {result.seeds[0]}..{result.seeds[-1]}), "
             f"wall {result.wall_s:.0f} s",
             f"incidents injected: {len(result.verdicts)}, validated (scored): {s['injected']}, "
             f"dropped by the paired control: {len(result.dropped)}"]
    for key in ("recall", "top1_accuracy", "top3_accuracy", "subject_accuracy",
                "top1_of_injected", "false_incidents_in_incident_runs",
                "false_incidents_per_clean_day"):
        value = s[key]
        lines.append(f"{key:>34}: {value:.3f}" if isinstance(value, float) else
                     f"{key:>34}: {value}")
    lines.append(f"{'clean simulated days':>34}: {result.score.clean_days:.3f}")
    sc = result.score
    lines.append(f"{'natural spikes labelled':>34}: {sc.natural_surges} surges, "
                 f"{sc.natural_saturations} saturations; incidents on them named right (not "
                 f"false): {sc.natural_named}, {sc.saturation_named} of them saturations")
    if sc.clean_days:  # the scoring before natural saturations, and surges, were labelled
        lines.append(f"{'false per clean day, saturations counted':>34}: "
                     f"{(sc.clean_false_incidents + sc.saturation_named) / sc.clean_days:.3f}")
        lines.append(f"{'false per clean day, both counted':>34}: "
                     f"{(sc.clean_false_incidents + sc.natural_named) / sc.clean_days:.3f}")
    if delays:
        lines.append(f"{'detection delay s (median, p90)':>34}: {statistics.median(delays):.0f}, "
                     f"{sorted(delays)[int(0.9 * (len(delays) - 1))]:.0f}")
    lines.append(confusion_table(result.score))
    confounded = [v for v in result.dropped if v.confounded]
    if confounded:
        lines.append(f"of which confounded (the target already slower than the control "
                     f"before the incident began): {len(confounded)}: " + ", ".join(
                         v.cause for v in confounded))
    if result.dropped:
        lines.append("dropped (strongest effect vs control): " + "; ".join(
            f"{v.cause} {v.metric or 'no data'} x{v.ratio:.2f}" if v.metric else
            f"{v.cause} ({v.requests} requests)" for v in result.dropped))
    return "\n".join(lines)
