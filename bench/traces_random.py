"""Issue 35's random-fleet check: on random simulated fleets, does the Traces page's
selection of an injected incident's slow band name the incident's subject first?

Each fleet is drawn by :func:`simulator.randomfleet.random_fleet` from ``S * 1000 + i`` and
run as the random accuracy suite runs it (:func:`bench.accuracy_random.run_fleet`:
simulator -> real collector -> pipeline -> analytics, and a paired control run without the
incidents that says which incidents measurably moved a latency metric). For every validated
incident that moved a latency metric, the selection a user would draw on the heatmap: the
incident's time span x the requests above the baseline of the metric the control says it
moved (``ttft_p90``: TTFT above the p90 of the view's requests outside the span). The view
is the page filtered to the service whose requests moved (the control's verdict says which)
or, for a subject that is a service, the whole fleet (a service filter would leave nothing
to tell it from). The comparison is the page's own
(:func:`analytics.traces.compare.compare` over :func:`~analytics.traces.compare.view_frame`);
its top difference ``dimension=value`` is compared with the injected subject *at the
requests' grain*:

- a GPU that no request of the view carries (a GPU of an engine instance on several GPUs:
  a request names its instance) is the instance holding it (``instance_gpus``): that is
  the finest thing the comparison can name, and it names the GPUs the instance holds;
- the top difference matches when it is the subject or names the same requests of the view
  (its ``same_as``: a host's only instance, an instance's only GPU).

    .venv/bin/python bench/traces_random.py [--fleets 12] [--seed 35] [--size small]
                                            [--workdir DIR]   (fleets already there reused)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetlens.analytics.attribution.dimensions import (  # noqa: E402
    REQUEST_COLUMN,
    metric_column,
)
from fleetlens.analytics.traces.compare import Selection, compare, view_frame  # noqa: E402
from fleetlens.analytics.traces.compare_rank import GPUS_COLUMN  # noqa: E402
from fleetlens.analytics.traces.heatmap import METRICS  # noqa: E402
from fleetlens.analytics.traces.query import TraceQuery  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.schema import tables as t  # noqa: E402
from fleetlens.pipeline.storage import DataDir, connect  # noqa: E402

#: Fewer selected requests than this and there is no band to select.
MIN_SELECTED = 5
#: Differences looked at for the subject's rank (the first is the one counted).
RANKED = 10


@dataclass(frozen=True)
class Case:
    """One injected incident's selection and what the comparison named first."""

    fleet: str
    cause: str
    #: the injected subject, and the subject at the requests' grain (:func:`at_grain`)
    injected: str
    subject: str
    metric: str
    selected: int
    top: str | None
    #: the subject's place among the differences (1: first; None: not among them)
    rank: int | None
    #: whether any request of the view has the subject's value
    resolvable: bool
    #: the top difference is the band outside the span's as much as the span's
    top_at_any_time: bool = False

    @property
    def matched(self) -> bool:
        return self.rank == 1


def quantile_of(window_metric: str) -> float:
    """0.9 for ``ttft_p90`` (the statistic the control found moved), 0.5 without one."""
    tail = window_metric.rsplit("_p", 1)
    return int(tail[1]) / 100 if len(tail) == 2 and tail[1].isdigit() else 0.5


def slow_band(frame: pl.DataFrame, start_ns: int, end_ns: int, metric: str,
              q: float) -> Selection:
    """The selection of ``metric``'s requests in ``[start_ns, end_ns)`` above the baseline:
    the ``q`` quantile of the view's requests outside that span."""
    arrival = pl.col(c.ARRIVAL_NS)
    rest = frame.filter((arrival < start_ns) | (arrival >= end_ns))[metric].drop_nulls()
    low = rest.quantile(q) if rest.len() else None
    return Selection(metric, start_ns, end_ns, low=None if low is None else float(low))


def ranked_differences(frame: pl.DataFrame, selection: Selection
                       ) -> tuple[list[set[str]], int, bool]:
    """The comparison's differences, best first, each as the ``dimension=value`` names of
    the requests it selects (itself and its ``same_as``); how many requests the selection
    holds; whether the first is at any time (as common in the band outside the span)."""
    result = compare(frame, selection, top=RANKED)
    names = [{f"{d.dimension}={d.value}", *d.same_as} for d in result.differences]
    first = result.differences[0].at_any_time if result.differences else False
    return names, result.selected, first


def at_grain(view: pl.DataFrame, subject: str) -> str:
    """``subject`` as the requests of ``view`` can name it: a GPU no request carries is the
    instance holding it (``instance_gpus``, as :func:`view_frame` attaches it), several
    instances joined by ``|``; anything else is itself."""
    dimension, _, gpu = subject.partition("=")
    if dimension != c.GPU_UUID or resolvable(view, subject) or GPUS_COLUMN not in view.columns:
        return subject
    held = view.filter(pl.col(GPUS_COLUMN).cast(pl.String).str.split(" ").list.contains(gpu))
    instances = sorted(set(held[c.INSTANCE_ID]))
    return f"{c.INSTANCE_ID}={'|'.join(instances)}" if instances else subject


def resolvable(view: pl.DataFrame, subject: str) -> bool:
    """Whether ``dimension=value`` is a value of some request of ``view``."""
    dimension, _, value = subject.partition("=")
    return dimension in view.columns and view[dimension].cast(pl.String).eq(value).any()


def view_of(frame: pl.DataFrame, subject: str, service: str) -> pl.DataFrame:
    """The requests a user would look at: the moved service's, or the whole fleet's when
    the subject is a service (or the control names none)."""
    if subject.startswith(f"{c.SERVICE_NAME}=") or not service:
        return frame
    return frame.filter(pl.col(c.SERVICE_NAME) == service)


def score_incidents(frame: pl.DataFrame, fleet: str, incidents: list[dict],
                    verdicts: list[dict]) -> tuple[list[Case], list[str]]:
    """The cases of one fleet's injected incidents (``frame``: every request of the fleet,
    :func:`view_frame`), and a note for each one left out (not validated by the control,
    no latency metric moved, or too few requests in the band)."""
    cases, left_out = [], []
    for inc, verdict in zip(incidents, verdicts, strict=True):
        what = f"{fleet} {inc['cause']} {inc['subject']}"
        if not verdict["valid"] or verdict["metric"] == "telemetry":
            left_out.append(f"{what}: {'no latency metric' if verdict['valid'] else 'dropped'}"
                            " (paired control)")
            continue
        family = verdict["metric"].split("_")[0]
        if family not in REQUEST_COLUMN or REQUEST_COLUMN[family] not in METRICS:
            # client_ttft/client_e2e: measured at the gateway, not drawn on the heatmap
            left_out.append(f"{what}: moved {verdict['metric']}, which the heatmap does not "
                            "draw")
            continue
        metric = metric_column(verdict["metric"])
        view = view_of(frame, inc["subject"], verdict.get("service", ""))
        band = slow_band(view, inc[c.START_NS], inc[c.END_NS], metric,
                         quantile_of(verdict["metric"]))
        ranked, selected, any_time = ranked_differences(view, band)
        if selected < MIN_SELECTED:
            left_out.append(f"{what}: {selected} requests in its {metric} band")
            continue
        subject = at_grain(view, inc["subject"])
        dimension, _, values = subject.partition("=")
        wanted = {f"{dimension}={v}" for v in values.split("|")}
        rank = next((i for i, names in enumerate(ranked, start=1) if wanted & names), None)
        cases.append(Case(fleet, inc["cause"], inc["subject"], subject, verdict["metric"],
                          selected, " = ".join(sorted(ranked[0])) if ranked else None, rank,
                          resolvable(view, subject.split("|")[0]), any_time))
    return cases, left_out


def fleet_cases(workdir: Path) -> tuple[list[Case], list[str]]:
    """Score a fleet directory the accuracy suite left (``verdicts.json`` and ``data/``)."""
    saved = json.loads((workdir / "verdicts.json").read_text())
    con = connect(DataDir(workdir / "data"), tables=(t.REQUESTS, t.INSTANCE_GPUS))
    try:
        frame = view_frame(con, TraceQuery())
    finally:
        con.close()
    return score_incidents(frame, workdir.name, saved["truth"]["incidents"], saved["verdicts"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", type=int, default=12)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--size", choices=("small", "full"), default="small")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    from bench.accuracy_random import run_fleet
    from fleetlens.simulator.randomfleet import FULL, SMALL, random_fleet

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fleetlens-traces-random-"))
    began = time.perf_counter()
    cases: list[Case] = []
    failed: list[str] = []
    for i in range(args.fleets):
        doc = random_fleet(args.seed * 1000 + i, SMALL if args.size == "small" else FULL)
        fleet_dir = workdir / doc["fleet"]["name"]
        if not (fleet_dir / "verdicts.json").exists():
            try:
                run_fleet(doc, workdir)
            except Exception as exc:  # noqa: BLE001 - one fleet's failure ends no draw
                # A fleet whose pipeline or analytics run fails has no verdicts to score: it
                # is listed (and counted below), and the draw goes on with the next one.
                failed.append(f"{doc['fleet']['name']}: {type(exc).__name__}: {exc}")
                print(f"  fleet failed: {failed[-1]}", flush=True)
                continue
        found, left_out = fleet_cases(fleet_dir)
        cases += found
        for case in found:
            grain = "" if case.subject == case.injected else (
                f" (at the requests' grain: {case.subject})")
            print(f"{case.fleet} {case.cause:18s} {case.injected}{grain} {case.metric} "
                  f"{case.selected} selected, first: {case.top}"
                  f"{' (at any time)' if case.top_at_any_time else ''} "
                  f"{'MATCH' if case.matched else f'miss (subject rank {case.rank})'}"
                  f"{'' if case.resolvable else ', subject no value of the requests'}",
                  flush=True)
        for note in left_out:
            print(f"  left out: {note}", flush=True)
    matched = sum(case.matched for case in cases)
    print(f"\nthe selection's top difference is the injected subject in {matched} of "
          f"{len(cases)} incidents ({args.fleets} fleets, seeds {args.seed * 1000}.."
          f"{args.seed * 1000 + args.fleets - 1}, --size {args.size}; "
          f"{time.perf_counter() - began:.0f} s; fleets in {workdir})")
    if failed:
        print(f"  {len(failed)} fleet(s) failed before scoring: {'; '.join(failed)}")
    named = [case for case in cases if case.resolvable]
    print(f"  of those whose subject is a value of their requests: "
          f"{sum(case.matched for case in named)} of {len(named)}; subject in the first 3: "
          f"{sum(bool(case.rank and case.rank <= 3) for case in cases)} of {len(cases)}; "
          f"GPUs counted as their instance: "
          f"{sum(case.subject != case.injected for case in cases)}")
    by_cause: dict[str, list[int]] = {}
    for case in cases:
        by_cause.setdefault(case.cause, [0, 0])[case.matched] += 1
    for cause, (miss, hit) in sorted(by_cause.items()):
        print(f"  {cause:22s} {hit} of {hit + miss}")


if __name__ == "__main__":
    main()
