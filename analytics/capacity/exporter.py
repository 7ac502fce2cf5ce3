"""The capacity families of ``fleetlens exporter`` (:mod:`analytics.exporter`), from the
`capacity` table the last analytics run stored (a snapshot per pool; nothing recomputed):
headroom, the rate at the knee, goodput per GPU at the knee and now, MBU and MFU, labelled by
pool (service, model, GPU model, TP, configuration). A pool without a figure (too few
windows for a knee) has no sample in that family rather than a made-up 0."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from fleetlens.analytics.published import read_table
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import exported as x
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir

#: capacity column -> (family, help)
_GAUGES = {
    c.HEADROOM_X: (x.CAPACITY_HEADROOM,
                   "Arrival-rate multiplier left before the pool's knee (knee rate / rate now)."),
    c.KNEE_RPS: (x.CAPACITY_KNEE_RPS,
                 "Requests per second the pool serves at its knee (largest batch meeting "
                 "the latency SLOs), all its GPUs together."),
    c.MBU: (x.CAPACITY_MBU, "Memory-bandwidth utilisation of decode (0..1), recent windows."),
    c.MFU: (x.CAPACITY_MFU, "Compute utilisation of prefill (0..1), recent windows."),
}
#: goodput column -> the ``at`` label
_GOODPUT = {c.GOODPUT_RPS_PER_GPU: "knee", c.GOODPUT_NOW_RPS_PER_GPU: "now"}


def _pool(row: dict) -> list[str]:
    return [str(row[k] if row[k] is not None else "") for k in
            (c.SERVICE_NAME, c.MODEL, c.GPU_MODEL, c.TP, c.CONFIG)]


def capacity_families(root: DataDir) -> list[Metric]:
    """Every capacity family from the stored `capacity` rows (empty families without)."""
    rows = list(read_table(root, t.CAPACITY).iter_rows(named=True))
    families = []
    for column, (name, doc) in _GAUGES.items():
        family = GaugeMetricFamily(name, doc, labels=x.POOL)
        for row in rows:
            if row[column] is not None:
                family.add_metric(_pool(row), float(row[column]))
        families.append(family)
    goodput = GaugeMetricFamily(
        x.CAPACITY_GOODPUT, "Requests per second per GPU meeting every SLO (DistServe's "
        "goodput), at the knee or now.", labels=(*x.POOL, x.GOODPUT_AT))
    for row in rows:
        for column, at in _GOODPUT.items():
            if row[column] is not None:
                goodput.add_metric([*_pool(row), at], float(row[column]))
    return [*families, goodput]


__all__ = ["capacity_families"]
