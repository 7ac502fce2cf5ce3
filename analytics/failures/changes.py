"""Configuration and version changes from `engine_configs`: a new fingerprint on an engine.

The evidence names the diff ("max_num_seqs 256 -> 2; version 0.11.0 -> 0.11.1"), read from
the two configurations' JSON. Engines of a service changed together (a rolling deploy within
``together_ns``) are one finding of the host or of the service. The restart a change comes
with is part of it, not an incident of its own (:func:`absorb_restarts`).
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from fleetlens.analytics.failures.findings import LEVEL_HOST, LEVEL_SERVICE, Finding
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000


def _flat(text: str | None, prefix: str = "") -> dict[str, Any]:
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        return {}
    out: dict[str, Any] = {}
    for key, value in (doc.items() if isinstance(doc, dict) else ()):
        if isinstance(value, dict):
            out.update(_flat(json.dumps(value), f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def diff(before: str | None, after: str | None) -> list[str]:
    """What changed between two configuration JSONs: ``"key old -> new"``, sorted by key;
    a nested key is dotted but for its last part (``cache_config.block_size`` reads
    ``block_size``) when that is unambiguous."""
    old, new = _flat(before), _flat(after)
    keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    taken = [s for s in short.values()]
    return [f"{short[k] if taken.count(short[k]) == 1 else k} {old.get(k, '-')} -> "
            f"{new.get(k, '-')}" for k in keys]


def changes(configs: pl.DataFrame, services: dict[str, str]) -> list[dict[str, Any]]:
    """One dict per engine whose fingerprint changed: where, when and the diff."""
    rows = (configs.unique([c.INSTANCE_ID, c.CONFIG_FINGERPRINT, c.START_NS])
            .sort(c.INSTANCE_ID, c.START_NS)
            .with_columns(pl.col(c.CONFIG_FINGERPRINT).shift(1).over(c.INSTANCE_ID)
                          .alias("_before"),
                          pl.col(c.CONFIG_JSON).shift(1).over(c.INSTANCE_ID)
                          .alias("_before_json"))
            .filter(pl.col("_before").is_not_null()
                    & (pl.col("_before") != pl.col(c.CONFIG_FINGERPRINT))))
    return [{**row, "_service": services.get(row[c.INSTANCE_ID], FLEET_WIDE),
             "_diff": diff(row["_before_json"], row[c.CONFIG_JSON])}
            for row in rows.iter_rows(named=True)]


def config_changes(configs: pl.DataFrame, services: dict[str, str], together_ns: int,
                   aftermath_ns: int) -> list[Finding]:
    """Findings of configuration changes, engines of a service changed together merged."""
    out: list[Finding] = []
    group: list[dict[str, Any]] = []
    for row in sorted(changes(configs, services), key=lambda r: (r["_service"], r[c.START_NS])):
        if group and (row["_service"] != group[0]["_service"]
                      or row[c.START_NS] - group[-1][c.START_NS] > together_ns):
            out.append(_finding(group, aftermath_ns))
            group = []
        group.append(row)
    if group:
        out.append(_finding(group, aftermath_ns))
    return sorted(out, key=lambda f: f.start_ns)


def _finding(group: list[dict[str, Any]], aftermath_ns: int) -> Finding:
    first = group[0]
    engines = sorted({r[c.INSTANCE_ID] for r in group})
    hosts = sorted({r[c.HOST_NAME] for r in group})
    if len(hosts) > 1:
        where, host, level = subject(c.SERVICE_NAME, first["_service"]), FLEET_WIDE, LEVEL_SERVICE
    elif len(engines) > 1:
        where, host, level = subject(c.HOST_NAME, hosts[0]), hosts[0], LEVEL_HOST
    else:
        where, host, level = subject(c.INSTANCE_ID, engines[0]), hosts[0], LEVEL_HOST
    changed = list(dict.fromkeys(d for r in group for d in r["_diff"])) or [
        f"fingerprint {first['_before']} -> {first[c.CONFIG_FINGERPRINT]}"]
    start = min(r[c.START_NS] for r in group)
    return Finding(
        Cause.CONFIG_CHANGE, where, first["_service"], first[c.MODEL] or "", host, start,
        max(r[c.START_NS] for r in group) + aftermath_ns, start, c.CONFIG_FINGERPRINT,
        float(len(engines)), None,
        f"configuration changed on {where.split('=', 1)[1]} ({len(engines)} engine"
        f"{'s' if len(engines) > 1 else ''}): " + "; ".join(changed),
        level, {"changes": changed, "instances": engines, "hosts": hosts,
                "fingerprint": first[c.CONFIG_FINGERPRINT],
                "previous_fingerprint": first["_before"]})


def absorb_restarts(found: list[Finding], restarts: list[Finding],
                    together_ns: int) -> list[Finding]:
    """The restarts that are not part of a configuration change (same engines, together).

    "Together" compares the restart's first scrape (``detected_ns``) with the change's (its
    new configuration's first scrape): the restart's start is the new process', which a
    real engine answers 30-90 s later."""
    left = []
    for r in restarts:
        engines = set(r.evidence.get("instances") or [r.evidence.get(c.INSTANCE_ID)])
        owner = next((f for f in found if f.cause == Cause.CONFIG_CHANGE
                      and abs(r.detected_ns - f.start_ns) <= together_ns
                      and engines & set(f.evidence["instances"])), None)
        if owner is None:
            left.append(r)
        else:
            owner.evidence["restarted"] = True
    return left
