"""Render an incident :class:`~analytics.report.Report` as text, Markdown or HTML.

HTML is self-contained (inline SVG plot, no scripts, every value escaped) so it can be
mailed or attached to a ticket and opened offline.
"""

from __future__ import annotations

import html
import json
from typing import Any

import polars as pl

from fleetlens.analytics.baselines import METHOD_ROLLING
from fleetlens.analytics.failures.findings import DETECTOR_PREFIX
from fleetlens.analytics.report import Report, iso
from fleetlens.analytics.units import duration, signed_duration, versus
from fleetlens.pipeline.schema import columns as c

_SPARK = "▁▂▃▄▅▆▇█"
NS = 1_000_000_000


def _scope(inc: dict[str, Any]) -> str:
    parts = [f"{k}={inc[k]}" for k in (c.SERVICE_NAME, c.MODEL, c.HOST_NAME) if inc[k] != "*"]
    return ", ".join(parts) or "fleet"


def _rolling(report: Report) -> pl.DataFrame:
    s = report.series
    return s.filter(pl.col(c.METHOD) == METHOD_ROLLING) if c.METHOD in s.columns else s


def sparkline(values: list[float]) -> str:
    """A one-line unicode chart of ``values``."""
    vals = [v for v in values if v is not None]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(_SPARK[min(7, int((v - lo) / span * 7.999))] if v is not None else " "
                   for v in values)


def _share(share: float | None) -> str:
    """A cause's share of the excess; a failure has none (it is no band's excess)."""
    return "a failure, no excess to share" if share is None else f"{share:.0%} of excess"


def _s(seconds: float | None) -> str:
    """Seconds to two places; a phase a failed request never reached is ``-``."""
    return "-" if seconds is None else f"{seconds:.2f}"


def _lift(lift: float | None) -> str:
    return "n/a" if lift is None else f"x{lift:.1f}"


def _period(period: dict[str, Any], bullet: str) -> list[str]:
    """The baseline period the phases were compared against (other incidents left out)."""
    if not period:
        return []
    return [f"{bullet}compared against {iso(period[c.BASELINE_START_NS])} -> "
            f"{iso(period[c.BASELINE_END_NS])} ({period[c.BASELINE_REQUESTS]:,} requests; "
            f"{period[c.INCIDENT_REQUESTS]:,} during the incident)"]


def _lines(report: Report, bullet: str) -> list[tuple[str, list[str]]]:
    """Sections as (title, lines); shared by text and Markdown."""
    inc = report.incident
    seconds = str(inc[c.METRIC]).endswith("_s")

    def level(value: float | None) -> str:
        return duration(value) if seconds else "n/a" if value is None else f"{value:.3g}"

    head = [
        f"{bullet}scope: {_scope(inc)} ({inc.get(c.LEVEL, '')})",
        f"{bullet}window: {iso(inc[c.START_NS])} -> {iso(inc[c.END_NS])} "
        f"({(inc[c.END_NS] - inc[c.START_NS]) / NS / 60:.0f} min)",
        f"{bullet}{inc[c.METRIC]}: peak {level(inc[c.PEAK])} vs expected "
        f"{level(inc[c.EXPECTED])} ({versus(inc[c.PEAK], inc[c.EXPECTED]) or 'no baseline'}); "
        f"severity {inc[c.SEVERITY]}; detector {inc[c.DETECTOR]}",
    ]
    causes = [f"{bullet}#{x[c.RANK]} {x[c.CAUSE]} on {x[c.SUBJECT]} (score {x[c.SCORE]:.2f}, "
              f"{_share(x[c.SHARE_OF_EXCESS])}): {x[c.SUMMARY]}" for x in report.causes]
    ev = report.evidence
    # a failure's evidence is what stopped: its keys as they are
    failed = [f"{bullet}{k}: {json.dumps(v)}" for k, v in sorted(ev.items())
              if str(inc[c.DETECTOR]).startswith(DETECTOR_PREFIX)]
    # The rows analytics stored (incident_phases, incident_dimensions): the page shows these.
    phases = [f"{bullet}{r[c.PHASE]}: {signed_duration(r[c.EXCESS_S])} per request "
              f"({r[c.SHARE]:.0%} of the excess)" for r in report.phases.iter_rows(named=True)]
    dims = [f"{bullet}{d[c.DIMENSION]}={d[c.DIMENSION_VALUE]}: lift {_lift(d[c.LIFT])}, "
            f"{d[c.SHARE_OF_EXCESS]:.0%} of excess"
            for d in report.dimensions.iter_rows(named=True)]
    phases += _period(report.period, bullet)
    signals = [f"{bullet}{k}: {json.dumps(v)}" for k, v in sorted(
        ev.get("signals", {}).items())]
    roll = _rolling(report)
    plot = [sparkline(roll[c.VALUE].to_list())] if roll.height else ["(no baseline data)"]
    # Each line leads with what the list is sorted by (the incident's own latency): e2e
    # first made a TTFT incident's list look unsorted.
    key = c.request_latency_column(str(inc[c.METRIC])) or c.E2E_S
    label = key.removesuffix("_s")
    slow = [f"{bullet}{label} {_s(r.get(key))} s: {r[c.REQUEST_ID]} trace {r[c.TRACE_ID]} on "
            f"{r[c.HOST_NAME]} (e2e {_s(r[c.E2E_S])} s: queue {_s(r[c.QUEUE_S])}, prefill "
            f"{_s(r[c.PREFILL_S])}, decode {_s(r[c.DECODE_S])}; "
            f"{r[c.INPUT_TOKENS]}->{r[c.OUTPUT_TOKENS]} tokens)"
            for r in report.slowest.iter_rows(named=True)]
    prov = report.provenance
    rng = prov.get("data_range", {})
    provenance = [
        f"{bullet}data range: {rng.get('start')} -> {rng.get('end')}",
        f"{bullet}row counts: {json.dumps(prov.get('row_counts', {}), sort_keys=True)}",
        f"{bullet}input sha256: {prov.get('input_sha256')}",
        f"{bullet}fleetlens version: {prov.get('fleetlens_version')}; computed at "
        f"{prov.get('computed_at')}; window {prov.get(c.WINDOW_S)} s",
    ]
    return [("Incident", head), ("Ranked causes", causes or [f"{bullet}(none)"]),
            *([("What failed (evidence)", failed)] if failed else []),
            ("Excess latency by phase (top cause's scope)", phases or [f"{bullet}(none)"]),
            ("Dimensions over-represented among slow requests", dims or [f"{bullet}(none)"]),
            ("Signals behind the top cause", signals),
            (f"{inc[c.METRIC]} over time (1 h before to 30 min after)", plot),
            (f"Slowest requests (by {label}, longest first)", slow or [f"{bullet}(none)"]),
            ("Provenance", provenance)]


def to_text(report: Report) -> str:
    """Plain-text report for a terminal."""
    inc = report.incident
    out = [f"fleetlens incident {inc[c.INCIDENT_ID]}", ""]
    for title, lines in _lines(report, "  "):
        out += [title, *lines, ""]
    return "\n".join(out).rstrip() + "\n"


def to_markdown(report: Report) -> str:
    """Markdown report (for tickets and chat)."""
    inc = report.incident
    out = [f"# fleetlens incident `{inc[c.INCIDENT_ID]}`", ""]
    for title, lines in _lines(report, "- "):
        body = ["```", *lines, "```"] if title.endswith("after)") else lines
        out += [f"## {title}", "", *body, ""]
    return "\n".join(out).rstrip() + "\n"


def _svg(report: Report, width: int = 720, height: int = 220) -> str:
    roll = _rolling(report).drop_nulls(c.VALUE)
    if roll.height < 2:
        return "<p>(no baseline data)</p>"
    ts = roll[c.TS_NS].to_list()
    vals = roll[c.VALUE].to_list()
    upper = [u if u is not None else v for u, v in zip(roll[c.UPPER], vals, strict=True)]
    lower = [x if x is not None else v for x, v in zip(roll[c.LOWER], vals, strict=True)]
    t0, t1 = ts[0], ts[-1]
    y1 = max(max(vals), max(upper)) * 1.05 or 1.0

    def x(v: int) -> float:
        return 40 + (v - t0) / max(t1 - t0, 1) * (width - 50)

    def y(v: float) -> float:
        return height - 20 - v / y1 * (height - 30)

    band = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(ts, upper, strict=True))
    band += " " + " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in
                           zip(reversed(ts), reversed(lower), strict=True))
    line = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(ts, vals, strict=True))
    inc = report.incident
    xs, xe = x(max(inc[c.START_NS], t0)), x(min(inc[c.END_NS], t1))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'role="img" aria-label="{html.escape(inc[c.METRIC])} with baseline band">'
            f'<rect x="{xs:.1f}" y="5" width="{max(xe - xs, 1):.1f}" height="{height - 25}" '
            'fill="#fde2e2"/>'
            f'<polygon points="{band}" fill="#cfe3f7" stroke="none"/>'
            f'<polyline points="{line}" fill="none" stroke="#1f4e79" stroke-width="1.5"/>'
            f'<text x="4" y="14" font-size="11">{y1 * 1000:.0f} ms</text>'
            f'<text x="4" y="{height - 22}" font-size="11">0</text>'
            f'<text x="40" y="{height - 4}" font-size="11">{html.escape(iso(t0))}</text>'
            f'<text x="{width - 170}" y="{height - 4}" font-size="11">'
            f'{html.escape(iso(t1))}</text></svg>')


def to_html(report: Report) -> str:
    """Self-contained HTML report with an inline SVG plot of the metric and its band."""
    inc = report.incident
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>fleetlens incident {html.escape(inc[c.INCIDENT_ID])}</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
             "li{margin:.2em 0}code{background:#f4f4f4}</style></head><body>",
             f"<h1>fleetlens incident <code>{html.escape(inc[c.INCIDENT_ID])}</code></h1>"]
    for title, lines in _lines(report, ""):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if title.endswith("after)"):
            parts.append(_svg(report))
            continue
        parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines)
                     + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def to_json(report: Report) -> str:
    """The report as one JSON object: the incident, its ranked causes with their evidence,
    what they were ranked on (``phases``, ``dimensions``, ``baseline_period``: the stored
    `incident_*` rows), the metric against its baseline around the incident, the slowest
    requests, provenance."""
    return json.dumps({
        "incident": report.incident, "causes": report.causes,
        "phases": report.phases.to_dicts(), "dimensions": report.dimensions.to_dicts(),
        "baseline_period": report.period,
        "series": report.series.to_dicts(), "slowest_requests": report.slowest.to_dicts(),
        "provenance": report.provenance,
    }, indent=2, default=str) + "\n"


RENDERERS = {"text": to_text, "markdown": to_markdown, "html": to_html, "json": to_json}
