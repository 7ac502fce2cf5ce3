"""docs/tables.md, the table contract as outside readers need it, written from the code.

Every table of :data:`~fleetlens.pipeline.schema.TABLES` with what one row is, who writes it,
its key and its required columns in order. The page is generated, never edited by hand:
``tests/pipeline/test_contract_doc.py`` fails when it differs from what this module prints,
so a column added to the contract reaches the page in the same change.

    python -m fleetlens.pipeline.schema.contract_doc > docs/tables.md
"""

from __future__ import annotations

from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.tables import TABLES

PIPELINE, ANALYTICS, COLLECTOR = "`fleetlens pipeline`", "`fleetlens analyze`", "the collector"

#: table -> (writer, what one row is). A table of the contract without a line here fails the
#: test, so the page cannot fall behind the code.
DESCRIPTIONS: dict[str, tuple[str, str]] = {
    t.SPANS: (COLLECTOR, "one OTLP span, as received (resource, scope and span fields)"),
    t.METRIC_POINTS: (COLLECTOR, "one OTLP metric data point (gauge, sum, histogram, summary)"),
    t.LOG_RECORDS: (COLLECTOR, "one OTLP log record (or event)"),
    t.REQUESTS: (PIPELINE, "one inference request: its phases, tokens and where it ran"),
    t.GPU_SAMPLES: (PIPELINE, "one GPU's NVML or DCGM readings at one instant"),
    t.ENGINE_SAMPLES: (PIPELINE, "one engine instance's gauges and counters at one instant"),
    t.WINDOWS: (PIPELINE, "one series (fleet, service or host) over one window: percentiles, "
                          "rates, KV cache, energy"),
    t.REQUEST_ENERGY: (PIPELINE, "the energy attributed to one request"),
    t.BASELINES: (ANALYTICS, "a series' expected value and band at one window"),
    t.INCIDENTS: (ANALYTICS, "one incident: scope, time span, severity, detector"),
    t.CAUSES: (ANALYTICS, "one ranked cause of an incident, with its score and evidence"),
    t.INCIDENT_PHASES: (ANALYTICS, "one phase's excess time per request in an incident"),
    t.INCIDENT_DIMENSIONS: (ANALYTICS, "one dimension value's lift and share of an "
                                       "incident's excess"),
    t.INCIDENT_PERIODS: (ANALYTICS, "the baseline period an incident was judged against and "
                                    "what it excluded"),
    t.GPU_WINDOW_ENERGY: (PIPELINE, "one GPU's energy over one window"),
    t.INSTANCE_GPUS: (PIPELINE, "which GPUs an engine instance held, from when to when"),
    t.GPU_SLOT_ENERGY: (PIPELINE, "one GPU's energy over one sampling slot"),
    t.ENGINE_CONFIGS: (PIPELINE, "one configuration fingerprint of an engine instance, first "
                                 "and last seen (a new one is a deploy)"),
    t.GPU_HEALTH: (PIPELINE, "a GPU health reading (Xid, ECC, remapped rows, lost) where it "
                             "changed"),
    t.SLO_WINDOWS: (ANALYTICS, "events and bad events of one SLO in one window"),
    t.SLO_STATUS: (ANALYTICS, "one SLO's compliance and error budget as of the latest run"),
    t.SLO_BURN_RATES: (ANALYTICS, "one SLO's burn rate over one alert window"),
    t.SLO_ALERTS: (ANALYTICS, "one burn-rate alert firing"),
    t.CAPACITY: (ANALYTICS, "one pool's knee, goodput, headroom, MBU/MFU and bound"),
    t.CAPACITY_WINDOWS: (ANALYTICS, "one engine instance's elasticity point in one window"),
    t.CAPACITY_CURVE: (ANALYTICS, "one pool's fitted curve at one batch size"),
}


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def contract_markdown() -> str:
    """docs/tables.md as it must read for the contract in this checkout."""
    out = ["# The table contract", "",
           "Generated from `pipeline/schema` by `python -m fleetlens.pipeline.schema.contract_doc"
           " > docs/tables.md`; do not edit by hand. Every table is Parquet under `raw/<signal>/`"
           " (written by the collector) or `derived/<table>/` (see docs/architecture.md,"
           " \"Storage\"). The columns listed are required, in this order; a table may have more"
           " (dimensions such as `region`). Timestamps are int64 nanoseconds since the epoch"
           " (UTC); ids are lowercase hex; attribute maps are JSON objects stored as strings."
           " What each figure means: docs/metrics-definitions.md and docs/analytics.md.", "",
           "| table | written by | one row is | key |", "|---|---|---|---|"]
    for name, table in TABLES.items():
        writer, row = DESCRIPTIONS[name]
        where = f"`raw/{table.raw_signal}/`" if table.raw_signal else f"`derived/{name}/`"
        key = ", ".join(f"`{k}`" for k in table.key)
        out.append(f"| [`{name}`](#{name}) ({where}) | {writer} | {row} "
                   f"| {key} |")
    for name, table in TABLES.items():
        out += ["", f"## {name}", "", f"{_sentence(DESCRIPTIONS[name][1])}", "",
                "| column | dtype |", "|---|---|"]
        out += [f"| `{col}` | {dtype} |" for col, dtype in table.dtypes.items()]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(contract_markdown(), end="")
