"""Stage ``energy``: GPU samples + requests -> ``request_energy``, ``gpu_window_energy`` and the
per-group window energy that ``windows`` joins.

Time is cut into slots of ``slot_s`` (10 s by default; they tile the windows). For each GPU and
slot:

* measured energy = the sum of the GPU's energy per native sample interval (10 Hz from the
  agent; :func:`~pipeline.gpupoints.energy_intervals`: counter deltas, else trapezoid of
  power), an interval that straddles a slot edge split in proportion to time;
* the requests active on that GPU in the slot (through the instance -> GPU mapping of the
  request's arrival hour, else every GPU of its host) each get a weight: the tokens they
  processed in the slot (prefill tokens spread over the prefill phase, one token per decode step
  spread over the decode phase);
* the slot's energy times the fraction of the slot in which at least one request was in prefill
  or decode is attributed, split by weight; the rest is idle energy.

All joules are summed as integer microjoules, so attributed + idle = measured holds exactly per
GPU and slot, and results do not depend on summation order (full run = incremental run).

The (request, GPU, slot) rows are the bulk of the work (millions an hour), so they carry only
integers: a GPU and an engine instance are one id each (:data:`GID`, :data:`IID`), a request its
row in the requests frame (:data:`RIX`) and a (service, model, host) group a dense number
(:data:`GRP`); names are joined back onto the small aggregated outputs. Callers add the request
keys once with :func:`with_request_keys`.
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.attrs import code, packed_codes
from fleetlens.pipeline.gpupoints import (
    GID,
    JOULES,
    T0,
    T1,
    GpuPoints,
    energy_intervals,
    gpu_points,
)
from fleetlens.pipeline.pivot import Split
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.slotkeys import (  # noqa: F401 - re-exported
    GK,
    SLOT,
    A,
    B,
    gpu_slot_key,
    union_ns,
    union_ns_general,
)
from fleetlens.pipeline.stage import stage

NS = 1_000_000_000
UJ = 1_000_000  # microjoules per joule
MILLI = 1000  # weights in milli-tokens

W = "__w"
MEASURED, COVERED, SHARE, HOUR = "__measured_uj", "__covered_ns", "__share_uj", "__hour_ns"
#: Integer keys, each valid within the frame that made it (the stages translate between
#: frames through small lookup tables): a (host, GPU) pair (:data:`GID`, imported), a
#: (host, instance) pair, a request's row in its frame and its (service, model, host) group.
IID, RIX, GRP = "__iid", "__rix", "__grp"
_GROUP = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]
#: What identifies a request: its span (request ids can repeat).
REQUEST_KEY = (c.TRACE_ID, c.SPAN_ID)
_union_ns, _union_ns_general = union_ns, union_ns_general


def _pair_id(first: str, second: str) -> pl.Expr:
    """One UInt64 per distinct (first, second) string pair of a frame."""
    return code(first).cast(pl.UInt64) * (1 << 32) + code(second).cast(pl.UInt64)


def _ceil_slot(ts: pl.Expr, slot_ns: int) -> pl.Expr:
    return ts - ts.mod(slot_ns)


def with_request_keys(requests: pl.DataFrame) -> pl.DataFrame:
    """``requests`` plus the integer keys the energy stages work on: :data:`RIX` (row number),
    :data:`IID` (host, instance) and :data:`GRP` (the (service, model, host) group). Pass this
    frame, or a filter of it, to every energy stage of one computation."""
    # The dense rank of the groups' codes: ranking their packed int64 (same order, same ranks)
    # sorts one integer column instead of row-encoded structs, about half the time.
    packed = packed_codes(requests, _GROUP)
    group = (pl.struct(*(code(col) for col in _GROUP)) if packed is None
             else pl.lit(packed)).rank("dense").cast(pl.Int64)
    return requests.with_row_index(RIX).with_columns(
        pl.col(RIX).cast(pl.Int64), _pair_id(c.HOST_NAME, c.INSTANCE_ID).alias(IID),
        group.alias(GRP))


@stage(t.GPU_SLOT_ENERGY)
def gpu_slot_energy(points: pl.DataFrame | Split | GpuPoints, slot_s: int, since_ns: int,
                    max_gap_s: float) -> pl.DataFrame:
    """Measured energy (µJ) and covered time (ns) per (host, GPU, slot) from the GPUs' native
    sample intervals that end at or after ``since_ns``.

    Input: ``metric_points`` (or their :class:`~pipeline.pivot.Split` or
    :class:`~pipeline.gpupoints.GpuPoints`) including each GPU's point before ``since_ns``
    (an interval ``(previous ts, ts]`` needs it); the intervals and their joules are
    :func:`~pipeline.gpupoints.energy_intervals`. Output: ``gpu_slot_energy`` sorted by its
    key; an interval straddling a slot edge is split in proportion to time, so a slot before
    ``since_ns`` can appear (each interval is counted once, in the partition of its end).
    """
    slot_ns = slot_s * NS
    gp = gpu_points(points)
    pieces = [_slot_pieces(iv.filter(pl.col(T0).is_not_null() & (pl.col(T1) > pl.col(T0))
                                     & (pl.col(T1) >= since_ns)), slot_ns)
              for iv in energy_intervals(gp, max_gap_s)]
    by = [c.HOST_NAME, c.GPU_UUID]
    empty = pl.DataFrame(schema={GID: pl.Int64, SLOT: pl.Int64, MEASURED: pl.Int64,
                                 COVERED: pl.Int64})
    out = pl.concat([empty, *pieces]).group_by(GID, SLOT).agg(
        pl.col(MEASURED).sum(), pl.col(COVERED).sum()).join(
        gp.gpus.select(pl.col(GID), *by), on=GID, how="left")
    return out.select(*by, pl.col(SLOT).alias(c.SLOT_START_NS),
                      pl.col(MEASURED).alias(c.MEASURED_UJ),
                      pl.col(COVERED).alias(c.COVERED_NS)).sort(by + [c.SLOT_START_NS])


def _slot_pieces(iv: pl.DataFrame, slot_ns: int) -> pl.DataFrame:
    """Measured µJ and covered ns per (GPU, slot) of intervals sorted by (GPU, end)."""
    iv = iv.with_columns(_ceil_slot(pl.col(T0), slot_ns).alias("__k0"),
                         _ceil_slot(pl.col(T1) - 1, slot_ns).alias("__k1"))
    k0, k1 = pl.col("__k0"), pl.col("__k1")
    # Most intervals lie inside one slot: µJ rounded per interval, then summed per (GPU, slot)
    # on one packed integer key, which comes sorted (no hashing of millions of rows).
    base = int(iv.get_column("__k0").min() or 0)
    slots = (int(iv.get_column("__k1").max() or 0) - base) // slot_ns + 1
    packed = (pl.col(GID) * slots + (k0 - base) // slot_ns).set_sorted()
    single = iv.filter(k0 == k1).group_by(packed.alias("__key"), maintain_order=True).agg(
        (pl.col(JOULES) * UJ).round(0).cast(pl.Int64).sum().alias(MEASURED),
        (pl.col(T1) - pl.col(T0)).sum().alias(COVERED),
    ).select((pl.col("__key") // slots).alias(GID),
             (pl.col("__key") % slots * slot_ns + base).alias(SLOT), MEASURED, COVERED)
    multi = iv.filter(k0 != k1).with_columns(
        pl.int_ranges(k0, k1 + 1, slot_ns).alias(SLOT)).explode(SLOT)
    overlap = (pl.min_horizontal(pl.col(T1), pl.col(SLOT) + slot_ns)
               - pl.max_horizontal(pl.col(T0), pl.col(SLOT)))
    multi = multi.select(
        GID, SLOT,
        (pl.col(JOULES) * UJ * overlap / (pl.col(T1) - pl.col(T0)))
        .round(0).cast(pl.Int64).alias(MEASURED),
        overlap.alias(COVERED),
    )
    return pl.concat([single, multi])


def gpu_slots(pieces: pl.DataFrame) -> pl.DataFrame:
    """``gpu_slot_energy`` rows (of several hour partitions) -> one row per (GPU, slot), with
    the :data:`GID` the attribution works on."""
    by = [c.HOST_NAME, c.GPU_UUID, c.SLOT_START_NS]
    out = pieces.group_by(by).agg(pl.col(c.MEASURED_UJ).sum(), pl.col(c.COVERED_NS).sum())
    gpu = pl.struct(c.HOST_NAME, c.GPU_UUID).rank("dense").cast(pl.Int64)  # small numbers
    return out.select(
        gpu.alias(GID), c.HOST_NAME, c.GPU_UUID,
        pl.col(c.SLOT_START_NS).alias(SLOT), pl.col(c.MEASURED_UJ).alias(MEASURED),
        pl.col(c.COVERED_NS).alias(COVERED))


def _phases(requests: pl.DataFrame) -> pl.DataFrame:
    """Prefill and decode intervals (ns, engine wall clock) and weights (milli-tokens)."""
    arrival, end = pl.col(c.ARRIVAL_NS), pl.max_horizontal(c.END_NS, c.ARRIVAL_NS)

    def ns(col: str) -> pl.Expr:
        return (pl.col(col) * NS).round(0).cast(pl.Int64)

    queued = arrival + ns(c.QUEUE_S).fill_null(0)
    first = pl.coalesce(arrival + ns(c.TTFT_S), queued + ns(c.PREFILL_S).fill_null(0))
    first = pl.min_horizontal(pl.max_horizontal(first, arrival), end)
    p0 = pl.coalesce(pl.col("__first") - ns(c.PREFILL_S), queued)
    d1 = pl.coalesce(pl.col("__first") + ns(c.DECODE_S), end)
    prefill_tokens = (pl.col(c.INPUT_TOKENS).fill_null(0)
                      - pl.col(c.CACHED_TOKENS).fill_null(0)).clip(lower_bound=1)
    decode_steps = (pl.col(c.OUTPUT_TOKENS).fill_null(0) - 1).clip(lower_bound=0)
    return requests.with_columns(first.alias("__first")).with_columns(
        pl.min_horizontal(pl.max_horizontal(p0, arrival), pl.col("__first")).alias("__p0"),
        pl.min_horizontal(pl.max_horizontal(d1, pl.col("__first")), end).alias("__d1"),
        (prefill_tokens * MILLI).alias("__wp"), (decode_steps * MILLI).alias("__wd"),
    )


def _spread(weight: str, lo: pl.Expr, hi: pl.Expr, slot_ns: int) -> pl.Expr:
    """Share of ``weight`` spread evenly over [lo, hi) that falls in the row's slot."""
    overlap = (pl.min_horizontal(hi, pl.col(SLOT) + slot_ns)
               - pl.max_horizontal(lo, pl.col(SLOT))).clip(lower_bound=0)
    instant = (lo >= pl.col(SLOT)) & (lo < pl.col(SLOT) + slot_ns)
    return (pl.when(hi > lo).then(pl.col(weight) * overlap / (hi - lo))
            .when(instant).then(pl.col(weight).cast(pl.Float64)).otherwise(0.0))


@stage(None)
def request_slot_weights(requests: pl.DataFrame, slot_s: int) -> pl.DataFrame:
    """One row per (request, slot it was in prefill or decode): weight and active interval.

    Input: ``requests`` with :func:`with_request_keys`. Output: :data:`RIX`, :data:`IID`,
    :data:`GRP`, arrival hour, slot start, weight (milli-tokens, int), active interval [a, b)
    in ns.
    """
    slot_ns = slot_s * NS
    ph = _phases(requests.select(RIX, IID, GRP, c.ARRIVAL_NS, c.END_NS, c.QUEUE_S, c.TTFT_S,
                                 c.PREFILL_S, c.DECODE_S, c.INPUT_TOKENS, c.CACHED_TOKENS,
                                 c.OUTPUT_TOKENS))
    k0 = _ceil_slot(pl.col("__p0"), slot_ns)
    k1 = _ceil_slot(pl.max_horizontal(pl.col("__d1") - 1, pl.col("__p0")), slot_ns)
    ph = ph.with_columns(pl.int_ranges(k0, k1 + 1, slot_ns).alias(SLOT)).explode(SLOT)
    p0, p1, d1 = pl.col("__p0"), pl.col("__first"), pl.col("__d1")
    weight = _spread("__wp", p0, p1, slot_ns) + _spread("__wd", p1, d1, slot_ns)
    return ph.select(
        RIX, IID, GRP,
        (pl.col(c.ARRIVAL_NS) - pl.col(c.ARRIVAL_NS).mod(3600 * NS)).alias(HOUR), SLOT,
        weight.round(0).cast(pl.Int64).alias(W),
        pl.max_horizontal(p0, pl.col(SLOT)).alias(A),
        pl.min_horizontal(d1, pl.col(SLOT) + slot_ns).alias(B),
    )


def _to_gpus(weights: pl.DataFrame, requests: pl.DataFrame, mapping: pl.DataFrame,
             slots: pl.DataFrame) -> pl.DataFrame:
    """Expand each (request, slot) row to the GPUs serving the request's instance (through the
    mapping of its arrival hour), else to every GPU of its host.

    The names meet only in small tables (instances, GPUs, mapping rows); the big frame joins on
    integers. A GPU in the mapping with no samples gets a :data:`GID` of its own (its slots
    then hold no energy, as for any unmeasured GPU)."""
    instances = requests.select(IID, c.HOST_NAME, c.INSTANCE_ID).unique(IID)
    gpus = slots.select(GID, c.HOST_NAME, c.GPU_UUID).unique(GID)
    named = mapping.filter(pl.col(c.GPU_UUID) != "").select(
        c.HOST_NAME, c.INSTANCE_ID, HOUR, c.GPU_UUID).unique()
    unseen = named.select(c.HOST_NAME, c.GPU_UUID).unique().join(
        gpus, on=[c.HOST_NAME, c.GPU_UUID], how="anti").sort(c.HOST_NAME, c.GPU_UUID)
    first_free = int(gpus.get_column(GID).max() or 0) + 1
    fresh = (pl.int_range(pl.len(), dtype=pl.Int64) + first_free).alias(GID)
    gpus = pl.concat([gpus, unseen.with_columns(fresh).select(gpus.columns)])
    mapped = named.join(instances, on=[c.HOST_NAME, c.INSTANCE_ID], how="inner").join(
        gpus, on=[c.HOST_NAME, c.GPU_UUID], how="inner").select(IID, HOUR, GID)
    direct = weights.join(mapped, on=[IID, HOUR], how="inner")
    unmapped = weights.join(mapped.select(IID, HOUR).unique(), on=[IID, HOUR], how="anti")
    host_gpus = instances.join(slots.select(GID, c.HOST_NAME).unique(GID), on=c.HOST_NAME,
                               how="inner").select(IID, GID)
    fallback = unmapped.join(host_gpus, on=IID, how="inner")
    return pl.concat([direct, fallback.select(direct.columns)])


@stage(None)
def attribute(
    weights: pl.DataFrame, requests: pl.DataFrame, mapping: pl.DataFrame, slots: pl.DataFrame,
    slot_s: int,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split every GPU slot's energy over its requests.

    ``requests`` is the frame (with :func:`with_request_keys`) the weights were computed from.
    Returns ``(shares, gpu_slots)``: shares has one row per (request, GPU, slot) with the
    request's keys (:data:`RIX`, :data:`GRP`), :data:`GID`, the request's weight and its share
    in µJ; gpu_slots one row per (host, GPU, slot) with measured, attributed and idle µJ,
    covered and active ns.
    """
    slot_ns = slot_s * NS
    rows = _to_gpus(weights, requests, mapping, slots)
    active = union_ns(rows, slot_ns)
    # (GPU, slot) as one int64 where it fits: the group-bys and joins below then hash one
    # integer column instead of row-encoding two (about half their time).
    packed = gpu_slot_key(slot_ns, rows, slots)
    gpu_key = [GID, SLOT] if packed is None else [GK]
    if packed is not None:
        rows, slots = rows.with_columns(packed), slots.with_columns(packed)
        active = active.with_columns(packed).select(GK, c.ACTIVE_S)
    totals = rows.group_by(gpu_key).agg(pl.col(W).sum().alias("__wsum"))
    per_slot = slots.join(totals, on=gpu_key, how="left").join(active, on=gpu_key, how="left")
    frac = pl.min_horizontal(
        pl.col(c.ACTIVE_S).fill_null(0) / pl.max_horizontal(pl.col(COVERED), 1), pl.lit(1.0))
    per_slot = per_slot.with_columns(
        pl.when(pl.col("__wsum") > 0).then((pl.col(MEASURED) * frac).floor())
        .otherwise(0).cast(pl.Int64).alias("__attr_uj"))
    shares = rows.join(per_slot.select(*gpu_key, "__attr_uj", "__wsum", COVERED),
                       on=gpu_key, how="left")
    shares = shares.select(
        *([] if packed is None else [GK]), RIX, GRP, GID, SLOT, W,
        pl.when(pl.col("__wsum") > 0)
        .then((pl.col("__attr_uj") * (pl.col(W) / pl.col("__wsum"))).floor())
        .otherwise(0).fill_null(0).cast(pl.Int64).alias(SHARE),
        (pl.col(W) * pl.col(COVERED).fill_null(0).clip(upper_bound=slot_ns) // slot_ns)
        .alias("__wcov"),
    )
    given = shares.group_by(gpu_key).agg(pl.col(SHARE).sum().alias("__given"))
    per_slot = per_slot.join(given, on=gpu_key, how="left").with_columns(
        pl.col("__given").fill_null(0).alias("__given"))
    per_slot = per_slot.with_columns(
        (pl.col(MEASURED) - pl.col("__given")).alias("__idle_uj"),
        pl.col(c.ACTIVE_S).fill_null(0),
    )
    if packed is not None:
        shares, per_slot = shares.drop(GK), per_slot.drop(GK)
    return shares, per_slot


@stage(t.REQUEST_ENERGY)
def request_energy(shares: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """Sum each request's shares: ``request_energy`` for the given requests, with the
    requests' (trace_id, span_id), the key that tells apart requests sharing a request_id
    (vLLM's n > 1 choices, restarted id counters).

    ``requests`` is (a filter of) the frame the shares were computed from, with its
    :func:`with_request_keys`. ``attribution_coverage`` is the part of the request's token
    weight that fell in GPU slots with measured energy (0 when its host reported no GPU at all;
    ``energy_j`` is then null).
    """
    per = shares.group_by(RIX).agg(pl.col(SHARE).sum(), pl.col("__wcov").sum(), pl.col(W).sum())
    out = requests.select(RIX, c.REQUEST_ID, *REQUEST_KEY, c.HOST_NAME, c.OUTPUT_TOKENS).join(
        per, on=RIX, how="left", maintain_order="left")
    coverage = pl.when(pl.col(W) > 0).then(pl.col("__wcov") / pl.col(W)).otherwise(0.0)
    out = out.with_columns(coverage.fill_null(0.0).alias(c.ATTRIBUTION_COVERAGE))
    energy = pl.when(pl.col(c.ATTRIBUTION_COVERAGE) > 0).then(pl.col(SHARE) / UJ)
    out = out.with_columns(energy.alias(c.ENERGY_J)).with_columns(
        pl.when(pl.col(c.OUTPUT_TOKENS) > 0)
        .then(pl.col(c.ENERGY_J) / pl.col(c.OUTPUT_TOKENS)).alias(c.J_PER_TOKEN))
    return out.select(*t.table(t.REQUEST_ENERGY).columns, *REQUEST_KEY).sort(
        c.REQUEST_ID, *REQUEST_KEY)


def _window_sums(per_slot: pl.DataFrame, window_s: int, by: list[str]) -> pl.DataFrame:
    """Per window and ``by``: measured = attributed + idle joules, covered and active seconds."""
    win = pl.col(SLOT) - pl.col(SLOT).mod(window_s * NS)
    return per_slot.with_columns(win.alias(c.WINDOW_START_NS)).group_by(
        c.WINDOW_START_NS, *by).agg(
        (pl.col(MEASURED).sum() / UJ).alias(c.MEASURED_J),
        (pl.col("__given").sum() / UJ).alias(c.ATTRIBUTED_J),
        (pl.col("__idle_uj").sum() / UJ).alias(c.IDLE_J),
        (pl.col(COVERED).sum() / NS).alias(c.COVERED_S),
        (pl.col(c.ACTIVE_S).sum() / NS).alias(c.ACTIVE_S),
    )


@stage(t.GPU_WINDOW_ENERGY)
def gpu_window_energy(per_slot: pl.DataFrame, window_s: int) -> pl.DataFrame:
    """Per GPU per window: measured = attributed + idle joules, covered and active seconds."""
    out = _window_sums(per_slot, window_s, [c.HOST_NAME, c.GPU_UUID]).with_columns(
        pl.lit(window_s, pl.Int64).alias(c.WINDOW_S))
    key = list(t.table(t.GPU_WINDOW_ENERGY).key)
    return out.select(list(t.table(t.GPU_WINDOW_ENERGY).columns)).sort(key)


@stage(None)
def host_group_energy(shares: pl.DataFrame, requests: pl.DataFrame, per_slot: pl.DataFrame,
                      window_s: int) -> pl.DataFrame:
    """Energy attributed to each (window, service, model, host) (:data:`SHARE`, integer µJ)
    and the mean power of the GPUs that served the group in the window (sum over GPUs, in GPU
    order, of J / covered s): one host's figures from that host's rows alone.

    ``requests`` (with :func:`with_request_keys`) names the groups of the shares; ``per_slot``
    is the second result of :func:`attribute`."""
    win = (pl.col(SLOT) - pl.col(SLOT).mod(window_s * NS)).alias(c.WINDOW_START_NS)
    rows = shares.select(GRP, GID, SHARE, win)
    energy = rows.group_by(c.WINDOW_START_NS, GRP).agg(pl.col(SHARE).sum())
    gpu_power = _window_sums(per_slot, window_s, [GID]).select(
        c.WINDOW_START_NS, GID, pl.when(pl.col(c.COVERED_S) > 0)
        .then(pl.col(c.MEASURED_J) / pl.col(c.COVERED_S)).alias(c.POWER_W))
    # GIDs rank (host, GPU): summed in GID order, a host's GPUs add up in the same order in a
    # shard of its own as in the whole fleet.
    gpus = rows.select(c.WINDOW_START_NS, GRP, GID).unique().sort(
        c.WINDOW_START_NS, GRP, GID).join(gpu_power, on=[c.WINDOW_START_NS, GID], how="left",
                                          maintain_order="left")
    power = gpus.group_by(c.WINDOW_START_NS, GRP, maintain_order=True).agg(
        pl.col(c.POWER_W).sum())
    names = requests.select(GRP, *_GROUP).unique(GRP)
    group = [c.WINDOW_START_NS, *_GROUP]
    return energy.join(power, on=[c.WINDOW_START_NS, GRP], how="left").join(
        names, on=GRP, how="left").select(*group, SHARE, c.POWER_W)


def fleet_group_energy(per_host: pl.DataFrame) -> pl.DataFrame:
    """Fleet-wide rows (``host_name = FLEET_WIDE``) per (window, service, model) from every
    shard's :func:`host_group_energy`: integer µJ summed, and the hosts' power added in host
    order (sorted first), so the float sum is the same however the hosts were sharded."""
    ordered = per_host.sort(c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL, c.HOST_NAME,
                            nulls_last=True)
    fleet = ordered.group_by(c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL, maintain_order=True
                             ).agg(pl.col(SHARE).sum(), pl.col(c.POWER_W).sum())
    return fleet.with_columns(pl.lit(FLEET_WIDE).alias(c.HOST_NAME)).select(per_host.columns)


def with_joules(groups: pl.DataFrame) -> pl.DataFrame:
    """Group energy rows with ``energy_j`` (from the integer µJ) instead of :data:`SHARE`."""
    return groups.with_columns((pl.col(SHARE) / UJ).alias(c.ENERGY_J)).drop(SHARE)


@stage(None)
def group_energy(shares: pl.DataFrame, requests: pl.DataFrame, per_slot: pl.DataFrame,
                 window_s: int) -> pl.DataFrame:
    """Energy attributed to each (window, service, model, host) and fleet-wide, and the mean
    power of the GPUs that served the group in the window (:func:`host_group_energy`, then
    :func:`fleet_group_energy`)."""
    per_host = host_group_energy(shares, requests, per_slot, window_s)
    return with_joules(pl.concat([per_host, fleet_group_energy(per_host)]))
