"""Scoring of ``bench/detect_delay.py``: match each injected incident to its first post,
and print the delays per kind against the targets (issue 30 item 6).

Posts are the native bodies the receiver got: incidents (``fleetlens.incident``, among them
provisional ones from the engines' gauges, ``status: provisional``) and updates
(``fleetlens.incident_update``: a provisional incident confirmed by an analysed incident,
which is then that incident's post, or withdrawn). Each injected incident is matched twice:
to its first post of any kind (what the on-call engineer sees), and to its first
span-based or failure post (a plain incident or a confirmation: when it would have been
posted without provisional incidents, in the same run, as the batch detection is the same).
The windows figure of a provisional post counts from the first anomalous window of the
incident that confirmed it (its own start when none did).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.detect_delay import Child

NS = 1_000_000_000
FAILURE_KINDS = ("engine_down", "engine_hang", "request_errors", "host_down", "telemetry_gap")
LATENCY_KINDS = ("traffic_surge", "kv_cache_pressure", "engine_overhead")
FAILURE_TARGET_S = 60.0
LATENCY_TARGET_WINDOWS = 2.0
#: A posted incident may start this long before the injected onset and still be its match
#: (a hang starts at the last progress, a silence at the last report).
START_SLACK_S = 30


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (the p95 of a handful of samples is near their max)."""
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = q * (len(data) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


class Clock:
    """Virtual (simulated) ns -> wall ns, from the simulator's per-tick progress."""

    def __init__(self, start_ns: int, ticks: list[tuple[float, int]]) -> None:
        self.start_ns = start_ns
        self.ticks = ticks  # (sim_s at the end of a tick, wall ns when it was played)

    def wall(self, virtual_ns: int) -> int:
        sim_s = (virtual_ns - self.start_ns) / NS
        for t1, wall in self.ticks:
            if t1 >= sim_s:
                return wall - int((t1 - sim_s) * NS)
        t1, wall = self.ticks[-1]
        return wall + int((sim_s - t1) * NS)

    def lag_s(self) -> float:
        """Largest delay of the simulator behind real time (0: it kept up)."""
        return max(((w - self.start_ns) / NS - t1 for t1, w in self.ticks), default=0.0)


def _scope_ok(gt: dict[str, Any], inc: dict[str, Any], top: dict[str, Any]) -> bool:
    if top.get("subject") == gt["subject"]:
        return True
    host = inc.get("host_name")
    if host and host != "*":
        return host in (gt.get("hosts") or [gt.get("host_name")])
    service = gt.get("service_name")
    return bool(service) and inc.get("service_name") == service


PROVISIONAL, INCIDENT, UPDATE = "provisional", "incident", "confirmed"


@dataclass
class Match:
    gt: dict[str, Any]
    onset_wall: int
    post: tuple[int, dict[str, Any]] | None = None
    wrong: list[str] = field(default_factory=list)
    #: The first post on its scope whatever its cause (a crash's 502s may page first as
    #: request_errors): arrival ns.
    first_any: int | None = None

    @property
    def delay_s(self) -> float:
        assert self.post is not None
        return (self.post[0] - self.onset_wall) / NS


def events(posts: list[tuple[int, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Every post as ``{"incident", "causes", "kind", "ref_start_ns", "body"}`` by arrival:
    ``ref_start_ns`` is the first anomalous window's start (a provisional post's is its
    confirming incident's)."""
    confirmed = {b["incident_id"]: b["incident"]["start_ns"] for _, b in posts
                 if isinstance(b, dict) and b.get("type") == "fleetlens.incident_update"
                 and b.get("status") == "confirmed"}
    out = []
    for arrived, b in sorted(posts, key=lambda p: p[0]):
        if not isinstance(b, dict) or "incident" not in b:
            continue
        inc = b["incident"]
        if b.get("type") == "fleetlens.incident_update":
            if b.get("status") != "confirmed":
                continue
            kind, ref = UPDATE, inc["start_ns"]
        elif b.get("type") == "fleetlens.incident":
            provisional = b.get("status") == "provisional"
            kind = PROVISIONAL if provisional else INCIDENT
            ref = confirmed.get(inc["incident_id"], inc["start_ns"])
        else:
            continue
        out.append((arrived, {"incident": inc, "causes": b.get("causes") or [], "kind": kind,
                              "ref_start_ns": ref, "body": b}))
    return out


def match(truth: list[dict[str, Any]], posts: list[tuple[int, Any]], clock: Clock,
          kinds: tuple[str, ...] = (PROVISIONAL, INCIDENT, UPDATE)) -> list[Match]:
    """Each injected incident's first post of the right cause and scope after its onset,
    among posts of ``kinds``."""
    incidents = [(t, e) for t, e in events(posts) if e["kind"] in kinds]
    out = []
    for gt in truth:
        m = Match(gt, clock.wall(gt["start_ns"]))
        for arrived, body in incidents:
            inc, causes = body["incident"], body["causes"]
            if arrived < m.onset_wall or not causes:
                continue
            if not (gt["start_ns"] - START_SLACK_S * NS <= inc["start_ns"] <= gt["end_ns"]):
                continue
            top = causes[0]
            if not _scope_ok(gt, inc, top):
                continue
            if m.first_any is None:
                m.first_any = arrived
            if top.get("cause") == gt["cause"]:
                m.post = (arrived, body)
                break
            m.wrong.append(f"{top.get('cause')} ({top.get('subject')})")
        out.append(m)
    return out


def _row(label: str, values: list[float], misses: int, unit: str = "s") -> str:
    if not values:
        return f"  {label:34s} n=0  misses {misses}"
    return (f"  {label:34s} n={len(values):<3d} median {statistics.median(values):6.1f} {unit}  "
            f"p95 {quantile(values, 0.95):6.1f} {unit}  max {max(values):6.1f} {unit}  "
            f"misses {misses}")


def report(matches: list[Match], clock: Clock, follow: Child, posts: list, window_s: int,
           interval_s: float, machine: str, overrides: dict[str, dict[str, Any]]) -> bool:
    """Print the figures; True when both targets are met."""
    print(f"\nmachine: {machine}")
    if overrides:
        print(f"settings changed from their defaults: {json.dumps(overrides)}")
    print(f"simulator lag behind real time: at most {clock.lag_s():.1f} s")
    runs = [json.loads(line)["seconds"] for _, s, line in follow.lines
            if s == "out" and line.startswith('{"') and '"new_segments"' in line]
    analytics = [(t, float(line.rsplit(" in ", 1)[1].split()[0])) for t, s, line in follow.lines
                 if s == "err" and line.startswith("analytics: ")]
    if runs and analytics:
        gaps = [(b - a) / NS for (a, _), (b, _) in zip(analytics, analytics[1:], strict=False)]
        secs = [x for _, x in analytics]
        print(f"follow loop: {len(runs)} pipeline runs, median {statistics.median(runs):.2f} s "
              f"(max {max(runs):.2f}); analytics median {statistics.median(secs):.2f} s "
              f"(max {max(secs):.2f}); an analytics run every "
              f"{statistics.median(gaps) if gaps else float('nan'):.1f} s (median period, "
              f"interval {interval_s:g} s); collector flush 5 s")
    print("\ndelay from onset to post, per kind (wall clock):")
    fail_all, lat_all, lat_win, fail_miss, lat_miss = [], [], [], 0, 0
    for kind in (*FAILURE_KINDS, *LATENCY_KINDS):
        mine = [m for m in matches if m.gt["cause"] == kind]
        if not mine:
            continue
        done = [m for m in mine if m.post]
        delays = [m.delay_s for m in done]
        misses = len(mine) - len(done)
        print(_row(kind, delays, misses))
        detector = [(clock.wall(m.post[1]["incident"]["detected_ns"]) - m.onset_wall) / NS
                    for m in done if m.post[1]["incident"].get("detected_ns")]
        rest = [(m.post[0] - clock.wall(m.post[1]["incident"]["detected_ns"])) / NS
                for m in done if m.post[1]["incident"].get("detected_ns")]
        if detector:
            print(f"    {'':32s} of which the detector's condition (onset to detected_ns) "
                  f"median {statistics.median(detector):.1f} s, the rest (the slow requests' "
                  f"spans, sent when they end; collector flush; follow loop; post) median "
                  f"{statistics.median(rest):.1f} s, max {max(rest):.1f} s")
        anyc = [(m.first_any - m.onset_wall) / NS for m in mine if m.first_any is not None]
        if anyc and anyc != delays:
            print(f"    {'':32s} first post on its scope, any cause: median "
                  f"{statistics.median(anyc):.1f} s, max {max(anyc):.1f} s")
        for m in mine:
            if m.post:
                inc = m.post[1]["incident"]
                at = (m.gt["start_ns"] - clock.start_ns) / NS
                print(f"    {m.gt['subject']:30s} onset +{at:4.0f} s"
                      f"  posted after {m.delay_s:5.1f} s  ({m.post[1]['kind']}: "
                      f"{inc.get('detector')}, {inc.get('metric')})")
            if not m.post:
                why = f"; posts of its scope named {', '.join(m.wrong)}" if m.wrong else ""
                print(f"    missed: {kind} {m.gt['subject']} at +"
                      f"{(m.gt['start_ns'] - clock.start_ns) / NS:.0f} s{why}")
        if kind in FAILURE_KINDS:
            fail_all += delays
            fail_miss += misses
        else:
            lat_all += delays
            lat_miss += misses
            first = [(m.post[0] - clock.wall(m.post[1]["ref_start_ns"] + window_s * NS))
                     / NS for m in done]
            lat_win += first
            if first:
                print(_row("  after its first anomalous window", first, 0))
    print("\noverall:")
    print(_row("failures, onset to post", fail_all, fail_miss))
    print(_row("latency, onset to post", lat_all, lat_miss))
    print(_row("latency, after 1st anomalous window", lat_win, lat_miss))
    win = [x / window_s for x in lat_win]
    print(_row("  ... in windows", win, lat_miss, unit="w"))
    fail_p95 = quantile(fail_all, 0.95) if fail_all else float("inf")
    lat_p95 = quantile(win, 0.95) if win else float("inf")
    fail_ok = fail_p95 <= FAILURE_TARGET_S and not fail_miss
    lat_ok = lat_p95 <= LATENCY_TARGET_WINDOWS and not lat_miss
    print(f"\ntargets: failures p95 <= {FAILURE_TARGET_S:.0f} s: {fail_p95:.1f} s, "
          f"{fail_miss} missed: {'met' if fail_ok else 'NOT met'}")
    print(f"         latency within {LATENCY_TARGET_WINDOWS:g} windows after the first "
          f"anomalous window closed (p95): {lat_p95:.2f} windows, {lat_miss} missed: "
          f"{'met' if lat_ok else 'NOT met'}")
    matched = {id(m.post[1]["body"]) for m in matches if m.post}
    other = [b for _, b in posts if isinstance(b, dict) and id(b) not in matched]
    if other:
        names = {}
        for b in other:
            top = (b.get("causes") or [{}])[0].get("cause", b.get("type"))
            names[top] = names.get(top, 0) + 1
        print(f"other posts (no injected incident matched to them: cascades, restarts, "
              f"second posts, false): {len(other)} {json.dumps(names, sort_keys=True)}")
    return fail_ok and lat_ok


def _latency_windows(matches: list[Match], clock: Clock, window_s: int) -> tuple[list[float],
                                                                                 int, int]:
    done = [m for m in matches if m.gt["cause"] in LATENCY_KINDS and m.post]
    missed = sum(1 for m in matches if m.gt["cause"] in LATENCY_KINDS and not m.post)
    win = [(m.post[0] - clock.wall(m.post[1]["ref_start_ns"] + window_s * NS)) / NS / window_s
           for m in done]
    return win, missed, len(done)


def compare(span_only: list[Match], everything: list[Match], clock: Clock, window_s: int,
            posts: list[tuple[int, Any]]) -> None:
    """The same run with and without its provisional posts (the span-based and failure
    posts are made in the same runs either way: the batch detection is unchanged)."""
    print("\nprovisional posts against span-based posts only (same run):")
    for label, ms in (("span-based and failure posts only", span_only),
                      ("with provisional posts", everything)):
        win, missed, named = _latency_windows(ms, clock, window_s)
        fail = [m.delay_s for m in ms if m.gt["cause"] in FAILURE_KINDS and m.post]
        fail_miss = sum(1 for m in ms if m.gt["cause"] in FAILURE_KINDS and not m.post)
        print(_row(f"latency ({label}), windows", win, missed, unit="w"))
        print(_row("  failures, onset to post", fail, fail_miss))
        print(f"  {'':34s} latency incidents named right: {named} of {named + missed}")
    kinds = [e["kind"] for _, e in events(posts)]
    updates = [b.get("status") for _, b in posts if isinstance(b, dict)
               and b.get("type") == "fleetlens.incident_update"]
    print(f"provisional incidents posted: {kinds.count(PROVISIONAL)}, confirmed: "
          f"{updates.count('confirmed')}, withdrawn: {updates.count('withdrawn')}")
    for arrived, e in events(posts):
        if e["kind"] != PROVISIONAL:
            continue
        inc, top = e["incident"], (e["causes"] or [{}])[0]
        state = next((b.get("status") for _, b in posts if isinstance(b, dict)
                      and b.get("incident_id") == inc["incident_id"]), "open")
        print(f"    {inc['service_name']}/{inc['host_name']} start "
              f"+{(inc['start_ns'] - clock.start_ns) / NS:4.0f} s posted "
              f"+{(arrived - clock.start_ns) / NS:4.0f} s guess {top.get('cause')} "
              f"({top.get('subject')}): {state}")
