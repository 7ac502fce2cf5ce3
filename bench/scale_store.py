"""Object-store benchmark: collector replicas publishing to S3, and obstore against s3fs.

1. ``clients``: obstore and s3fs (fsspec) on the same S3 server: PUT, GET and LIST of
   segment-sized objects (2 MiB, what a 25,000-span raw segment weighs) and of state-sized
   ones (2 KiB), one request at a time as the collector's flusher and the pipeline issue them.
   Wall time per request and the client's own CPU per request (``time.process_time``): the
   server is the same for both, so the CPU is what the client library costs.
2. ``replicas``: two ``fleetlens collector`` processes (one worker each, each with its own
   local WAL and writer id) behind a round-robin of closed-loop OTLP/gRPC clients
   (``bench/ingest.py``'s), publishing to one bucket: spans/s acknowledged, and the S3 requests
   they cost, counted by the server from its request log (every request, by method).

The S3 server is moto's (``moto_server``, Python, on 127.0.0.1): a real S3 REST endpoint, far
slower than S3 or MinIO, so absolute request times are moto's; the client CPU and the request
counts are not.

    .venv/bin/python bench/scale_store.py [--seconds 15] [--clients 2] [--objects 40]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest import SPANS_PER_REQUEST, _client  # noqa: E402 - needs REPO on sys.path
from tests.s3 import moto_server  # noqa: E402

_REQUEST_LINE = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP')


def _requests(log: Path, offset: int) -> Counter[str]:
    """Requests the server logged after byte ``offset`` of its log, by method."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        text = handle.read().decode(errors="replace")
    return Counter(m.group(1) for m in _REQUEST_LINE.finditer(text))


def _timed(fn, count: int) -> tuple[float, float]:
    """(wall ms, client CPU ms) per call of ``fn(i)`` over ``count`` calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        fn(i)
    return ((time.perf_counter() - wall) * 1000 / count,
            (time.process_time() - cpu) * 1000 / count)


def _measure(name: str, put, get, listing, objects: int, big: bytes,
             small: bytes) -> dict[str, tuple]:
    keys = objects * 5
    return {
        "put 2 MiB": _timed(lambda i: put(f"{name}/big/{i}.parquet", big), objects),
        "get 2 MiB": _timed(lambda i: get(f"{name}/big/{i}.parquet"), objects),
        "put 2 KiB": _timed(lambda i: put(f"{name}/small/{i}.json", small), objects * 4),
        "get 2 KiB": _timed(lambda i: get(f"{name}/small/{i}.json"), objects * 4),
        f"list {keys} keys": _timed(lambda i: listing(f"{name}/"), 5),
    }


def clients(endpoint: str, bucket: str, objects: int) -> dict[str, dict[str, tuple]]:
    """PUT/GET/LIST figures of obstore and s3fs against the same bucket."""
    import obstore
    import s3fs
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=endpoint, region="us-east-1",
                    virtual_hosted_style_request=False, client_options={"allow_http": True})
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, use_listings_cache=False,
                           skip_instance_cache=True)
    big, small = os.urandom(2 << 20), os.urandom(2 << 10)
    out: dict[str, dict[str, tuple]] = {}
    for name, put, get, listing in (
        ("obstore",
         lambda k, d: obstore.put(store, k, d),
         lambda k: bytes(obstore.get(store, k).bytes()),
         lambda p: [m for chunk in obstore.list(store, p, chunk_size=1000) for m in chunk]),
        ("s3fs",
         lambda k, d: fs.pipe_file(f"{bucket}/{k}", d),
         lambda k: fs.cat_file(f"{bucket}/{k}"),
         lambda p: fs.find(f"{bucket}/{p}", detail=True)),
    ):
        figures = _measure(name, put, get, listing, objects, big, small)
        out[name] = figures
    return out


def replicas(endpoint: str, env_s3: dict[str, str], log: Path, bucket: str, seconds: float,
             n_clients: int) -> dict[str, float]:
    """Two collector replicas publishing to ``bucket`` under closed-loop load."""
    from fleetlens.collector.testing import free_port, wait_for_port
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.storage import DataDir, scan

    url = f"s3://{bucket}/fleet"
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    with tempfile.TemporaryDirectory(prefix="fleetlens-scale-") as tmp:
        procs, addresses = [], []
        before_start = log.stat().st_size
        config = Path(tmp) / "collector.toml"
        config.write_text('[collector]\nself_metrics_address = ""\n')  # two on one host
        for n in (1, 2):
            address = f"127.0.0.1:{free_port()}"
            env = {**base, **env_s3, "FLEETLENS_WAL_DIR": f"{tmp}/wal{n}"}
            with open(f"{tmp}/collector{n}.log", "ab") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "fleetlens", "collector", "--data-dir", url,
                     "--config", str(config), "--grpc-address", address,
                     "--http-address", f"127.0.0.1:{free_port()}", "--workers", "1"],
                    stdout=out, stderr=subprocess.STDOUT, env=env))
            try:
                wait_for_port(address, 60, procs[-1])
            except RuntimeError:
                print(Path(f"{tmp}/collector{n}.log").read_text()[-3000:], file=sys.stderr)
                raise
            addresses.append(address)
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        start_at = time.time() + 4.0
        offset = log.stat().st_size
        loaders = [context.Process(target=_client, args=(addresses[k % 2], k, start_at,
                                                         seconds, queue))
                   for k in range(n_clients)]
        for loader in loaders:
            loader.start()
        results = [queue.get(timeout=seconds + 120) for _ in loaders]
        for loader in loaders:
            loader.join()
        during = _requests(log, offset)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(120)
        whole = _requests(log, before_start)
    acked = sum(len(lat) for lat, _ in results) * SPANS_PER_REQUEST
    stored = scan(DataDir(url), "spans").select(c.TRACE_ID).collect().height
    lat = sorted(x for got, _ in results for x in got)
    return {"spans_per_s": acked / seconds, "acked": acked, "stored": stored,
            "p50_ms": statistics.median(lat) * 1000,
            "s3_requests_per_s": sum(during.values()) / seconds,
            "puts_per_s": during["PUT"] / seconds,
            "spans_per_put": acked / max(during["PUT"], 1),
            "requests_whole_run": sum(whole.values()), "by_method": dict(whole)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--objects", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs, moto_server(Path(logs)) as server:
        os.environ.update(server.env)
        print(f"S3 server: moto at {server.endpoint}")
        for name, figures in clients(server.endpoint, server.bucket("bench"),
                                     args.objects).items():
            for op, (wall, cpu) in figures.items():
                print(f"  {name:8s} {op:14s} {wall:8.2f} ms/request  {cpu:7.2f} ms client CPU")
        r = replicas(server.endpoint, server.env, server.log_path, server.bucket("scale"),
                     args.seconds, args.clients)
        print(f"2 collector replicas, {args.clients} closed-loop clients, {args.seconds:g} s: "
              f"{r['spans_per_s']:,.0f} spans/s acknowledged (p50 {r['p50_ms']:.1f} ms), "
              f"stored {r['stored']:,} of {r['acked']:,} acked; "
              f"S3 {r['s3_requests_per_s']:.1f} requests/s ({r['puts_per_s']:.1f} PUT/s, "
              f"{r['spans_per_put']:,.0f} spans per PUT); whole run with start-up and "
              f"shutdown: {r['requests_whole_run']} requests {r['by_method']}")


if __name__ == "__main__":
    main()
