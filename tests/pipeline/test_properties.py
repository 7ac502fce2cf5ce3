"""Hypothesis property tests of single stages: rows in = rows out with duplicates removed, and
energy conservation per GPU slot for arbitrary requests and samples."""

from __future__ import annotations

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlens.pipeline import energy as en
from fleetlens.pipeline.normalize import normalize
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from tests.pipeline.rawdata import NS, T0, point, points_frame, span, spans_frame, vllm_span

NO_MODELS = pl.DataFrame(schema={"instance_id": pl.String, "model": pl.String})
FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def span_sets(draw):
    n = draw(st.integers(0, 25))
    rows, requests = [], 0
    for i in range(n):
        kind = draw(st.sampled_from(["vllm", "gateway", "failed_gateway", "internal", "genai"]))
        start = T0 + draw(st.integers(0, 3600)) * NS
        if kind == "vllm":
            rows.append(vllm_span(i, start_ns=start, completion=draw(st.integers(0, 3)),
                                  prefill=draw(st.none() | st.floats(0, 1)),
                                  decode=draw(st.none() | st.floats(0, 1))))
            requests += 1
        elif kind == "genai":
            rows.append(span(i, 1, "chat", start_ns=start, end_ns=start + NS, kind=2,
                             attrs={a.GEN_AI_OUTPUT_TOKENS: 3}))
            requests += 1
        elif kind == "failed_gateway":  # no engine answered it: a failed request
            rows.append(span(i, 1, a.GATEWAY_SPAN, start_ns=start, end_ns=start + NS, kind=2,
                             status=2))
            requests += 1
        else:
            name = a.GATEWAY_SPAN if kind == "gateway" else "internal"
            rows.append(span(i, 1, name, start_ns=start, end_ns=start + NS, kind=2))
    dups = draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=10)) if n else []
    return rows + [dict(rows[d]) for d in dups], requests


@FAST
@given(span_sets())
def test_rows_in_equal_rows_out(case) -> None:
    rows, requests = case
    out = normalize(spans_frame(rows), NO_MODELS, {})
    assert out.height == requests
    assert out.select("trace_id", "span_id").is_unique().all()


_REQUEST_KEYS = ("request_id", "trace_id", "span_id", "host_name", "instance_id",
                 "service_name", "model", "arrival_ns", "end_ns", "queue_s", "prefill_s",
                 "decode_s", "ttft_s", "input_tokens", "output_tokens", "cached_tokens")


@st.composite
def energy_cases(draw):
    n_req = draw(st.integers(0, 8))
    reqs = []
    for i in range(n_req):
        arrival = T0 + draw(st.integers(0, 40_000)) * 1_000_000
        prefill, decode = draw(st.floats(0, 5)), draw(st.floats(0, 20))
        reqs.append({
            # ids repeat (vLLM n > 1): requests are told apart by their span
            "request_id": f"r{i % 3}", "trace_id": f"{i:032x}", "span_id": f"{i:016x}",
            "host_name": "h", "instance_id": draw(st.sampled_from(
                ["i0", "i1", "unmapped"])), "service_name": "s", "model": "m",
            "arrival_ns": arrival, "end_ns": arrival + int((prefill + decode + 0.1) * NS),
            "queue_s": 0.05, "prefill_s": prefill, "decode_s": decode,
            "ttft_s": draw(st.none() | st.just(0.05 + prefill)),
            "input_tokens": draw(st.none() | st.integers(0, 500)),
            "output_tokens": draw(st.integers(0, 300)), "cached_tokens": None,
        })
    columns = {k: v for k, v in t.table(t.REQUESTS).columns.items() if k in _REQUEST_KEYS}
    requests = pl.DataFrame(reqs, schema=columns)
    samples, points = [], []
    for g in ("G0", "G1"):
        ts = T0 - 2 * NS
        gaps = draw(st.lists(st.integers(100, 8000), min_size=2, max_size=25))
        joules = draw(st.lists(st.floats(0, 500), min_size=len(gaps), max_size=len(gaps)))
        for gap, joule in zip(gaps, joules, strict=True):
            ts += gap * 1_000_000
            samples.append({"host_name": "h", "gpu_uuid": g, "ts_ns": ts,
                            "energy_delta_j": joule})
            # the agent's energy as a delta sum: the joules since the GPU's previous point
            points.append({**point(a.HW_ENERGY, ts, joule, host="h", attrs={a.HW_ID: g},
                                   unit="J", kind="sum"), c.TEMPORALITY: "delta"})
    gpu = pl.DataFrame(samples).sort("host_name", "gpu_uuid", "ts_ns")
    mapping = pl.DataFrame({"host_name": ["h", "h"], "instance_id": ["i0", "i1"],
                            "gpu_uuid": ["G0", "G1"], en.HOUR: [T0, T0]})
    return requests, gpu, points_frame(points), mapping


@FAST
@given(energy_cases())
def test_energy_conservation_per_gpu_slot(case) -> None:
    requests, gpu, points, mapping = case
    requests = en.with_request_keys(requests)
    slots = en.gpu_slots(en.gpu_slot_energy(points, 10, int(gpu["ts_ns"].min()), 60.0))
    weights = en.request_slot_weights(requests, 10)
    shares, per_slot = en.attribute(weights, requests, mapping, slots, 10)
    assert (per_slot[en.MEASURED] == per_slot["__given"] + per_slot["__idle_uj"]).all()
    assert (per_slot["__idle_uj"] >= 0).all() and (per_slot["__given"] >= 0).all()
    assert int(shares[en.SHARE].sum() or 0) == int(per_slot["__given"].sum() or 0)
    # measured energy in slots = the samples' energy, up to rounding to a microjoule per piece
    first = gpu.group_by("gpu_uuid").agg(pl.col("ts_ns").min())
    counted = gpu.join(first, on=["gpu_uuid", "ts_ns"], how="anti")["energy_delta_j"].sum()
    pieces = slots.height + gpu.height
    assert abs(per_slot[en.MEASURED].sum() / 1e6 - counted) <= pieces * 1e-6
    energy = en.request_energy(shares, requests)
    assert energy.height == requests.height
    assert energy.select(en.REQUEST_KEY).n_unique() == requests.height
    # every share counted once, in the one request it belongs to (ids repeat)
    total_uj = float(energy[c.ENERGY_J].fill_null(0).sum()) * 1e6
    assert abs(total_uj - int(shares[en.SHARE].sum() or 0)) <= requests.height
    assert ((energy["attribution_coverage"] >= 0) & (energy["attribution_coverage"] <= 1)).all()


@st.composite
def slot_intervals(draw):
    """Request intervals inside 10 s slots of a few GPUs (overlapping, nested, touching)."""
    slot = 10 * NS
    rows = []
    for _ in range(draw(st.integers(0, 40))):
        gpu, k = draw(st.integers(0, 3)), draw(st.integers(0, 5))
        a_off = draw(st.integers(0, slot))
        b_off = draw(st.integers(0, slot))
        rows.append({en.GID: gpu, en.SLOT: T0 - T0 % slot + k * slot,
                     en.A: T0 - T0 % slot + k * slot + a_off,
                     en.B: T0 - T0 % slot + k * slot + b_off})
    schema = {en.GID: pl.Int64, en.SLOT: pl.Int64, en.A: pl.Int64, en.B: pl.Int64}
    return pl.DataFrame(rows, schema=schema)


@FAST
@given(slot_intervals())
def test_packed_interval_union_equals_the_general_one(rows) -> None:
    key = [en.GID, en.SLOT]
    fast = en._union_ns(rows, 10 * NS).sort(key)
    general = en._union_ns_general(rows.filter(pl.col(en.B) > pl.col(en.A))).sort(key)
    assert fast.select(*key, c.ACTIVE_S).rows() == general.select(*key, c.ACTIVE_S).rows()
    # the union never exceeds the slot, nor the sum of its intervals
    assert (fast[c.ACTIVE_S] <= 10 * NS).all()
