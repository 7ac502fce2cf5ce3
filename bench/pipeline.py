"""Pipeline benchmark: normalize + windows + energy over synthetic raw Parquet.

Full scale (``--scale 1``): one day of a 64-GPU fleet (16 hosts x 4 GPUs, one vLLM instance per
GPU): 10M vLLM-style ``llm_request`` spans (about 116 requests/s) and 10 Hz GPU samples
(``hw.power`` + ``hw.energy`` per GPU: 55.3M samples, 110.6M metric points), plus engine
metrics every second and the instance -> GPU mapping every 10 s. ``--scale`` shrinks the
*duration* (24 h x scale) at the same rates, so per-hour costs stay comparable.

Then it appends 1% more data (the next 0.24 h x scale of the same fleet, starting on the hour
after the day) and runs the pipeline incrementally: the printed ratio is incremental time /
full time. A new hour also redoes the previous hour's energy (a GPU sample's interval reaches
back into it), so it then appends another 0.5% inside that same hour, the common case for
``--follow``, and prints that ratio too. Each pipeline run is a separate process, so its time
and peak RSS are its own.

    .venv/bin/python bench/pipeline.py --scale 0.05 [--keep DIR]
    .venv/bin/python bench/pipeline.py --rerun DIR --compare REF [--repeat 3]

``--compare`` times full recomputes of a kept data dir by the pipeline as of git REF (e.g. the
commit before an optimisation) and by this checkout, alternating, and prints medians and the
ratio: before/after figures from one machine in one sitting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleetlens.pipeline.schema import attributes as a  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.schema import conform  # noqa: E402
from fleetlens.pipeline.schema import tables as t  # noqa: E402
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic  # noqa: E402

NS = 1_000_000_000
HOUR_NS = 3600 * NS
HOSTS, GPUS_PER_HOST = 16, 4
GPUS = HOSTS * GPUS_PER_HOST
RPS = 10_000_000 / 86_400
SAMPLE_HZ = 10
SEGMENTS_PER_HOUR = 4


def _hex(rng: np.random.Generator, n: int, nbytes: int) -> pl.Series:
    buf = rng.bytes(n * nbytes)
    arr = pa.Array.from_buffers(pa.binary(nbytes), n, [None, pa.py_buffer(buf)])
    return pl.Series(pl.from_arrow(arr)).cast(pl.Binary).bin.encode("hex")


def _instances() -> tuple[list[str], list[str], list[str], list[str]]:
    hosts = [f"host-{g // GPUS_PER_HOST:02d}" for g in range(GPUS)]
    inst = [f"{hosts[g]}/vllm-{g % GPUS_PER_HOST}" for g in range(GPUS)]
    uuids = [f"GPU-{g:08x}-0000-4000-8000-{g:012x}" for g in range(GPUS)]
    res = [json.dumps({a.SERVICE_NAME: "chat", a.HOST_NAME: hosts[g],
                       a.SERVICE_INSTANCE_ID: inst[g], "gen_ai.request.model": "llama-3-70b",
                       "region": ["eu", "us"][g % 2]}) for g in range(GPUS)]
    return hosts, inst, uuids, res


def make_spans(rng: np.random.Generator, lo: int, hi: int) -> pl.DataFrame:
    """vLLM-style request spans arriving in [lo, hi)."""
    n = int(RPS * (hi - lo) / NS)
    hosts, _inst, _uuids, res = _instances()
    gpu = rng.integers(0, GPUS, n)
    arrival = np.sort(rng.integers(lo, hi, n))
    prompt = np.clip(rng.lognormal(6.0, 1.0, n), 1, 8000).astype(np.int64)
    completion = rng.choice(np.array([0, 1, 2, 16, 64, 128, 256, 512]), n)
    queue = rng.exponential(0.05, n)
    prefill = 0.01 + prompt / 20_000
    decode = completion * 0.015
    e2e = queue + prefill + decode + 0.003
    finish = np.where(completion == 512, '"[\\"length\\"]"', '"[\\"stop\\"]"')
    attrs = pl.Series('{"gen_ai.request.n": 1, "gen_ai.request.temperature": 0.7, '
                      '"gen_ai.response.finish_reasons": ' + finish + "}")
    frame = pl.DataFrame({
        c.TRACE_ID: _hex(rng, n, 16), c.SPAN_ID: _hex(rng, n, 8),
        c.PARENT_SPAN_ID: pl.repeat("", n, eager=True), c.NAME: a.VLLM_REQUEST_SPAN,
        c.KIND: 2, c.START_NS: arrival, c.END_NS: arrival + (e2e * NS).astype(np.int64),
        c.STATUS_CODE: 0, c.SERVICE_NAME: "chat",
        c.HOST_NAME: pl.Series(hosts).gather(gpu),
        c.RESOURCE_ATTRIBUTES: pl.Series(res).gather(gpu), c.SCOPE_NAME: "vllm.tracing",
        c.ATTRIBUTES: attrs, c.GEN_AI_REQUEST_ID: pl.Series([f"cmpl-{i}" for i in range(n)]),
        c.GEN_AI_TIME_IN_QUEUE_S: queue, c.GEN_AI_TTFT_S: queue + prefill + 0.001,
        c.GEN_AI_E2E_S: e2e, c.GEN_AI_PREFILL_S: prefill, c.GEN_AI_DECODE_S: decode,
        c.GEN_AI_INFERENCE_S: prefill + decode, c.GEN_AI_PROMPT_TOKENS: prompt,
        c.GEN_AI_COMPLETION_TOKENS: completion, c.GEN_AI_MAX_TOKENS: 512,
    }).with_columns((pl.col(c.END_NS) + NS).alias(c.RECEIVED_NS))
    return conform(frame, t.SPANS)


def make_points(rng: np.random.Generator, lo: int, hi: int, energy0: np.ndarray) -> pl.DataFrame:
    """GPU samples at 10 Hz, engine metrics at 1 Hz, the mapping gauge every 10 s."""
    hosts, inst, uuids, _res = _instances()
    step = NS // SAMPLE_HZ
    ts = np.arange(lo, hi, step)
    k = len(ts)
    power = 150 + 500 * rng.random((GPUS, k))
    energy = energy0[:, None] + np.cumsum(power / SAMPLE_HZ, axis=1)
    energy0[:] = energy[:, -1]
    gpu_idx = np.repeat(np.arange(GPUS), k)
    gattrs = [json.dumps({a.HW_ID: uuids[g], a.HW_NAME: "NVIDIA H100 80GB HBM3",
                          a.HW_TYPE: a.HW_TYPE_GPU, a.GPU_INDEX: g % GPUS_PER_HOST},
                         sort_keys=True) for g in range(GPUS)]
    agent_res = [json.dumps({a.SERVICE_NAME: "fleetlens-agent", a.HOST_NAME: h}) for h in hosts]

    def block(name: str, kind: str, unit: str, values: np.ndarray, times: np.ndarray,
              idx: np.ndarray, attrs: list[str]) -> pl.DataFrame:
        return pl.DataFrame({
            c.METRIC_NAME: name, c.METRIC_KIND: kind, c.UNIT: unit, c.TS_NS: times,
            c.VALUE: values, c.TEMPORALITY: "cumulative" if kind == "sum" else "",
            c.IS_MONOTONIC: kind == "sum", c.SERVICE_NAME: "fleetlens-agent",
            c.HOST_NAME: pl.Series(hosts).gather(idx),
            c.RESOURCE_ATTRIBUTES: pl.Series(agent_res).gather(idx),
            c.ATTRIBUTES: pl.Series(attrs).gather(idx),
        })

    all_ts = np.tile(ts, GPUS)
    blocks = [block(a.HW_POWER, "gauge", "W", power.ravel(), all_ts, gpu_idx, gattrs),
              block(a.HW_ENERGY, "sum", "J", energy.ravel(), all_ts, gpu_idx, gattrs)]
    eng_ts = np.arange(lo, hi, NS)
    eattrs = [json.dumps({a.ENGINE_INSTANCE: inst[g], a.ENGINE_MODEL_NAME: "llama-3-70b"},
                         sort_keys=True) for g in range(GPUS)]
    e_idx = np.repeat(np.arange(GPUS), len(eng_ts))
    e_all = np.tile(eng_ts, GPUS)
    blocks.append(block(a.ENGINE_KV_CACHE_USAGE, "gauge", "1", rng.random(len(e_all)), e_all,
                        e_idx, eattrs))
    base = (e_all - lo) / NS
    blocks.append(block(a.ENGINE_PREFIX_CACHE_QUERIES, "sum", "{token}", base * 1000, e_all,
                        e_idx, eattrs))
    blocks.append(block(a.ENGINE_PREFIX_CACHE_HITS, "sum", "{token}", base * 400, e_all,
                        e_idx, eattrs))
    map_ts = np.arange(lo, hi, 10 * NS)
    mattrs = [json.dumps({a.ENGINE_INSTANCE: inst[g], a.HW_ID: uuids[g]}, sort_keys=True)
              for g in range(GPUS)]
    m_idx = np.repeat(np.arange(GPUS), len(map_ts))
    blocks.append(block(a.ENGINE_INSTANCE_GPUS, "gauge", "1", np.ones(len(m_idx)),
                        np.tile(map_ts, GPUS), m_idx, mattrs))
    frame = pl.concat(blocks).sort(c.TS_NS).with_columns(
        (pl.col(c.TS_NS) + NS).alias(c.RECEIVED_NS))
    return conform(frame, t.METRIC_POINTS)


def write_hours(dd: DataDir, first_hour: int, hours: float, seed: int, energy0: np.ndarray,
                writer: str, segment_rows: int = 0) -> tuple[int, int]:
    """Generate and publish raw segments hour by hour; returns (spans, metric points).

    Each hour's rows go to :data:`SEGMENTS_PER_HOUR` segments per table, or, with
    ``segment_rows``, to segments of that many rows (the collector's ``flush_rows``).
    """
    rng = np.random.default_rng(seed)
    spans = points = 0
    end = first_hour + int(hours * HOUR_NS)
    h = first_hour
    seq = 0
    while h < end:
        hi = min(h + HOUR_NS, end)
        for frame, table in ((make_spans(rng, h, hi), t.SPANS),
                             (make_points(rng, h, hi, energy0), t.METRIC_POINTS)):
            n = frame.height
            spans += n if table == t.SPANS else 0
            points += n if table == t.METRIC_POINTS else 0
            signal = t.table(table).raw_signal
            parts = -(-n // segment_rows) if segment_rows else SEGMENTS_PER_HOUR
            for part in range(parts):
                lo_row = part * n // parts
                piece = frame.slice(lo_row, (part + 1) * n // parts - lo_row)
                seq += 1
                write_parquet_atomic(piece, dd.raw_segment_path(signal, h, writer, seq))
        h = hi
    return spans, points


_CHILD = """
import importlib.util, json, resource, sys, time
sys.path.insert(0, {repo!r})
if {peer!r}:
    # The installed package maps fleetlens.pipeline to this checkout whatever sys.path says:
    # load the peer's package under that name first, its submodules then come from its folder.
    import fleetlens
    spec = importlib.util.spec_from_file_location(
        "fleetlens.pipeline", {peer!r} + "/__init__.py", submodule_search_locations=[{peer!r}])
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleetlens.pipeline"] = module
    spec.loader.exec_module(module)
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.stage import STATS
from fleetlens.pipeline.storage import DataDir
began = time.perf_counter()
summary = Pipeline(DataDir({data!r}), PipelineConfig()).run_once(full={full!r})
wall = time.perf_counter() - began
stages = {{k: [v.rows_out, round(v.seconds, 2)] for k, v in STATS.totals().items()}}
use = resource.getrusage(resource.RUSAGE_SELF)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM"))
print(json.dumps({{"wall_s": wall, "rss_mb": hwm / 1024,
                  "cpu_s": use.ru_utime + use.ru_stime, "stages": stages,
                  "dirty_hours": summary.dirty_hours, "rows": summary.rows_written,
                  "package": sys.modules["fleetlens.pipeline"].__file__}}))
"""


def run_pipeline(data: Path, full: bool = False, repo: Path = REPO) -> dict:
    """One pipeline run over ``data`` in a child process: its wall, CPU and peak RSS.

    ``repo`` other than this checkout: the ``pipeline`` package under it (see
    :func:`export_ref`) is the one imported as ``fleetlens.pipeline``."""
    peer = "" if repo == REPO else str(repo / "pipeline")
    code = _CHILD.format(repo=str(repo), data=str(data), full=full, peer=peer)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


#: The issue-17 target for a full run of the bench day on the local runner.
DAY_CPU_TARGET_S = 50.0


def machine() -> str:
    """CPU model, core count and load average: CPU-s on a shared machine need them beside."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), model)
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, load average {load}"


def _print_run(label: str, run: dict) -> None:
    print(f"{label}: {run['wall_s']:.2f} s wall, {run['cpu_s']:.2f} s CPU (both cores), "
          f"peak RSS {run['rss_mb']:.0f} MiB, {run['dirty_hours']} hours")
    for name, (rows, secs) in run["stages"].items():
        print(f"  stage {name:24s} {rows:>12,} rows out {secs:8.2f} s")


def export_ref(ref: str, into: Path) -> Path:
    """The ``pipeline`` package as of git ``ref``, unpacked under ``into`` (a peer to time)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "pipeline"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def compare(data: Path, ref: str, repeat: int) -> None:
    """Full recomputes of ``data`` by the code at ``ref`` and by this checkout, alternating
    (same machine, same minute), ``repeat`` times each: medians and the ratio."""
    import statistics

    with tempfile.TemporaryDirectory(prefix="fleetlens-ref-") as tmp:
        peer = export_ref(ref, Path(tmp))
        runs: dict[str, list[dict]] = {ref: [], "this checkout": []}
        for _ in range(repeat):
            runs[ref].append(run_pipeline(data, full=True, repo=peer))
            runs["this checkout"].append(run_pipeline(data, full=True))
            # the two sides must really run different code (an installed package wins over
            # sys.path: that once made both sides this checkout)
            assert runs[ref][-1]["package"].startswith(str(peer)), runs[ref][-1]["package"]
            assert runs["this checkout"][-1]["package"].startswith(str(REPO))
    med = {}
    for label, done in runs.items():
        med[label] = {k: statistics.median(r[k] for r in done)
                      for k in ("wall_s", "cpu_s", "rss_mb")}
        walls = ", ".join(f"{r['wall_s']:.2f}" for r in done)
        print(f"{label}: median {med[label]['wall_s']:.2f} s wall ({walls}), "
              f"{med[label]['cpu_s']:.2f} s CPU, peak RSS {med[label]['rss_mb']:.0f} MiB")
    now = med["this checkout"]
    print(f"ratio {ref} / this checkout: {med[ref]['wall_s'] / now['wall_s']:.2f}x wall, "
          f"{med[ref]['cpu_s'] / now['cpu_s']:.2f}x CPU, "
          f"{med[ref]['rss_mb'] / now['rss_mb']:.2f}x peak RSS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the day to generate (1 = 24 h, 10M spans)")
    parser.add_argument("--keep", type=Path, default=None, help="data dir to keep")
    parser.add_argument("--rerun", type=Path, default=None,
                        help="only time a full recompute of a data dir made with --keep")
    parser.add_argument("--compare", metavar="REF", default=None,
                        help="with --rerun: time the pipeline of git REF against this checkout")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side (--compare)")
    parser.add_argument("--segment-rows", type=int, default=0, metavar="N",
                        help="raw segments of N rows, as the collector writes them (its "
                             f"flush_rows is 25,000) [default: {SEGMENTS_PER_HOUR} per hour]")
    args = parser.parse_args()
    if args.rerun:
        print(f"machine: {machine()}")
    if args.rerun and args.compare:
        compare(args.rerun, args.compare, args.repeat)
        print(f"machine after: {machine()}")
        return
    if args.rerun:
        _print_run("full recompute", run_pipeline(args.rerun, full=True))
        return
    print(f"machine: {machine()}")
    root = args.keep or Path(tempfile.mkdtemp(prefix="fleetlens-bench-"))
    dd = DataDir(root)
    hours = 24 * args.scale
    start = (time.time_ns() // HOUR_NS - 48) * HOUR_NS
    energy0 = np.full(GPUS, 1e7)
    began = time.perf_counter()
    rows = args.segment_rows
    spans, points = write_hours(dd, start, hours, 1, energy0, "gen", rows)
    files = sum(1 for _ in (root / "raw").rglob("*.parquet"))
    print(f"scale {args.scale}: {hours:.2f} h, {spans:,} spans, {points:,} metric points "
          f"({GPUS} GPUs at {SAMPLE_HZ} Hz) in {files:,} raw segments; generated in "
          f"{time.perf_counter() - began:.1f} s")
    full = run_pipeline(root)
    _print_run("full run", full)
    day_cpu = full["cpu_s"] / args.scale
    print(f"full run CPU scaled to the bench day (/ {args.scale}): {day_cpu:.1f} CPU-s, target "
          f"<= {DAY_CPU_TARGET_S:.0f} (the process start-up, about 0.3 CPU-s, is scaled up too)")
    inc_hours = hours * 0.01
    next_hour = start + int(np.ceil(hours)) * HOUR_NS
    new_spans, new_points = write_hours(dd, next_hour, inc_hours, 2, energy0, "gen2", rows)
    inc = run_pipeline(root)
    print(f"incremental run over +1% ({new_spans:,} spans, {new_points:,} points): "
          f"{inc['wall_s']:.2f} s wall, {inc['cpu_s']:.2f} s CPU, peak RSS "
          f"{inc['rss_mb']:.0f} MiB, {inc['dirty_hours']} hours; ratio incremental/full = "
          f"{inc['wall_s'] / full['wall_s']:.3f} (wall), "
          f"{inc['cpu_s'] / full['cpu_s']:.3f} (CPU)")
    # What --follow pays between hour edges: more data inside the hour already started (the
    # +1% above starts a new hour, which also redoes the previous hour's energy).
    more_start = next_hour + int(inc_hours * HOUR_NS)
    more_spans, more_points = write_hours(dd, more_start, inc_hours / 2, 3, energy0, "gen3",
                                          rows)
    more = run_pipeline(root)
    print(f"incremental run over +0.5% inside that hour ({more_spans:,} spans, "
          f"{more_points:,} points): {more['wall_s']:.2f} s wall, {more['cpu_s']:.2f} s CPU, "
          f"{more['dirty_hours']} hours; ratio incremental/full = "
          f"{more['wall_s'] / full['wall_s']:.3f} (wall), "
          f"{more['cpu_s'] / full['cpu_s']:.3f} (CPU)")
    noop = run_pipeline(root)
    print(f"rerun with nothing new: {noop['wall_s']:.3f} s")
    if args.keep is None:
        import shutil

        shutil.rmtree(root)
    print(json.dumps({"scale": args.scale, "spans": spans, "points": points,
                      "full_s": round(full["wall_s"], 2), "full_cpu_s": round(full["cpu_s"], 2),
                      "full_rss_mb": round(full["rss_mb"]), "day_cpu_s": round(day_cpu, 1),
                      "inc_s": round(inc["wall_s"], 2),
                      "inc_cpu_s": round(inc["cpu_s"], 2),
                      "ratio": round(inc["wall_s"] / full["wall_s"], 4),
                      "cpu_ratio": round(inc["cpu_s"] / full["cpu_s"], 4),
                      "inside_hour_s": round(more["wall_s"], 2),
                      "inside_hour_ratio": round(more["wall_s"] / full["wall_s"], 4)}))
    os.sync()


if __name__ == "__main__":
    main()
