"""The simulation loop on a virtual clock, and the Python API :func:`run`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator.engine import Instance
from fleetlens.simulator.failures import failed_records
from fleetlens.simulator.fleet import Fleet
from fleetlens.simulator.logs import StallLogger
from fleetlens.simulator.metrics import Sampler
from fleetlens.simulator.scenario import Scenario, load_scenario
from fleetlens.simulator.telemetry import (
    ExportCounts,
    ProcessExporter,
    ThreadExporter,
    gateway_record,
    llm_request_record,
)
from fleetlens.simulator.workload import Request


class NullExporter:
    """Sends nothing: a control run only needs the simulation itself."""

    def spans(self, records: list) -> None:
        pass

    def metrics(self, collections: list, points: int) -> None:
        pass

    def logs(self, records: list) -> None:
        pass

    def flush(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> ExportCounts:
        return ExportCounts()


Exporter = ThreadExporter | ProcessExporter | NullExporter


@dataclass
class Progress:
    """Where a run is; passed to the ``on_progress`` callback after every tick."""

    sim_s: float = 0.0
    end_s: float = 0.0
    requests: int = 0
    finished: int = 0
    spans: int = 0
    points: int = 0
    logs: int = 0


@dataclass
class RunResult:
    """What a run did. ``ground_truth`` is the JSON document of injected incidents."""

    seed: int
    sim_s: float
    wall_s: float
    requests: int
    finished: int
    unfinished: int
    rejected: int
    spans: int
    points: int
    exported: ExportCounts
    ground_truth: dict = field(repr=False)
    logs: int = 0  # engine log records (NCCL warnings, watchdog timeouts during stalls)
    failed: int = 0  # requests failed by failure incidents (lost, refused, timed out, aborted)


def run(scenario: Scenario | str | Path, endpoint: str | None = "127.0.0.1:4317", *,
        seed: int | None = None, speed: float | None = None, start_ns: int | None = None,
        exporters: tuple[SpanExporter, MetricExporter] | tuple[
            SpanExporter, MetricExporter, Callable[[Any], int]] | None = None,
        ground_truth_path: str | Path | None = None, token: str | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        probe: Callable[[Instance, list[Request]], None] | None = None,
        export: bool = True) -> RunResult:
    """Simulate a scenario and send its telemetry.

    Args:
        scenario: a :class:`Scenario` or the path of a TOML scenario file.
        endpoint: OTLP/gRPC ``host:port`` of the collector (ignored with ``exporters``); the
            SDK's OTLP exporters run in a child process.
        seed: random seed; default the scenario's ``[fleet].seed``.
        start_ns: virtual time zero (ns since the epoch) instead of ``[fleet].start``.
        speed: simulated seconds per wall second; ``None`` runs as fast as it can.
        exporters: a (span exporter, metric exporter) pair to use instead, on a thread, and
            optionally a third item: a callable taking each OTLP ExportLogsServiceRequest of
            engine log records and returning how many it rejected (without it, no logs).
        ground_truth_path: where to write the ground-truth JSON.
        token: bearer token for a collector with ``auth_tokens`` (OTLP/gRPC only).
        on_progress: called after every tick with a :class:`Progress`.
        probe: called with each instance and its newly finished requests (paired-control
            validation reads the latencies the simulation produced, before any export).
        export: False simulates without sending or building any telemetry (a control run).

    Returns:
        counts of requests, spans and points, and the ground truth.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    seed = scenario.seed if seed is None else seed
    if start_ns is not None:
        scenario = replace(scenario, start_ns=start_ns)
    fleet = Fleet(scenario, seed)
    truth = fleet.injector.ground_truth(seed)
    if ground_truth_path is not None:
        Path(ground_truth_path).write_text(json.dumps(truth, indent=2) + "\n")
    resources = {**fleet.resources, **fleet.gateways, **fleet.agents}
    if not export:
        exporter = NullExporter()
    elif exporters is not None:
        log_export = exporters[2] if len(exporters) > 2 else None
        exporter = ThreadExporter(exporters[0], exporters[1], resources, scenario.start_ns,
                                  log_export=log_export)
    else:
        exporter = ProcessExporter(endpoint or "127.0.0.1:4317", resources, scenario.start_ns,
                                   token=token)
    try:
        logger = StallLogger(seed, scenario.start_ns, {
            iid: int(r[a.VLLM_PROCESS_ID]) for iid, r in fleet.resources.items()})
        progress = _loop(scenario, fleet, exporter, speed, on_progress, probe, logger)
    except BaseException:  # interrupted or failed: stop the exporter, drop what is queued
        if isinstance(exporter, ProcessExporter | NullExporter):
            exporter.abort()
        else:
            exporter.close()
        raise
    counts = exporter.close()
    wall = progress.wall_s
    unfinished = sum(len(i.pending) + len(i.waiting) + len(i.running) for i in fleet.instances)
    return RunResult(seed, progress.p.sim_s, wall, progress.p.requests, progress.p.finished,
                     unfinished, fleet.rejected, progress.p.spans, progress.p.points, counts,
                     truth, progress.p.logs, fleet.injector.failures.failed)


@dataclass
class _Outcome:
    p: Progress
    wall_s: float


def _loop(sc: Scenario, fleet: Fleet, exporter: Exporter, speed: float | None,
          on_progress: Callable[[Progress], None] | None,
          probe: Callable[[Instance, list[Request]], None] | None = None,
          logger: StallLogger | None = None) -> _Outcome:
    tick = sc.tick_s
    end = sc.duration_s + sc.drain_s
    ticks_per_sample = max(1, round(sc.sample_interval_s / tick))
    sampler = Sampler()
    p = Progress(end_s=end)
    wall0 = time.perf_counter()
    assigned = {id(g) for inst in fleet.instances for g in inst.gpus}
    spare = [g for g in fleet.gpus if id(g) not in assigned]
    failures = fleet.injector.failures
    i = 0
    while True:
        t0, t1 = i * tick, (i + 1) * tick
        fleet.injector.update(t0)
        if logger is not None:
            records = logger.tick(fleet.instances, t0, t1)
            exporter.logs(records)
            p.logs += len(records)
        p.requests += fleet.arrive(t0, t1)
        for inst in fleet.instances:
            inst.advance(t1)
        for g in spare:
            g.idle(tick)
        if failures.hung:
            failures.tick(t1)
        if failures.records:  # 5xx gateway spans of crashes, refusals and timeouts
            exporter.spans(failures.records)
            p.spans += len(failures.records)
            failures.records = []
        retune = {id(g) for g in fleet.gpus if g.control(tick)}
        for inst in fleet.instances:
            if any(id(g) in retune for g in inst.gpus):
                inst.retune()
            if inst.finished:
                if probe is not None:
                    probe(inst, inst.finished)
                p.spans += _emit(fleet, inst, exporter)
                p.finished += len(inst.finished)
                inst.finished = []
        i += 1
        if i % ticks_per_sample == 0 and not isinstance(exporter, NullExporter):
            p.points += _sample(fleet, sampler, exporter, sc.start_ns, t1, tick * ticks_per_sample)
        p.sim_s = t1
        if speed:
            exporter.flush()
            ahead = wall0 + t1 / speed - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        if on_progress is not None:
            on_progress(p)
        if t1 >= end - 1e-9 or (t1 >= sc.duration_s and fleet.idle()
                                and i % ticks_per_sample == 0):
            return _Outcome(p, time.perf_counter() - wall0)


def _emit(fleet: Fleet, inst, exporter: Exporter) -> int:
    start = fleet.scenario.start_ns
    model = inst.deployment.model.name
    records = []
    for r in inst.finished:
        if r.status:  # aborted, or already answered 504 by the gateway
            records += failed_records(r, inst, start)
            continue
        records.append(llm_request_record(r, inst.id, start))
        if r.gateway_span_id:
            records.append(gateway_record(r, r.gateway, start, model, inst.host, inst.id))
    exporter.spans(records)
    return len(records)


def _sample(fleet: Fleet, sampler: Sampler, exporter: Exporter, start_ns: int, t: float,
            interval: float) -> int:
    ts = start_ns + round(t * 1e9)
    collected, points = [], 0
    silent = fleet.injector.failures.silent
    for host in fleet.scenario.hosts:
        collection, n = sampler.collect(host.name, ts, t, interval, fleet.host_gpus[host.name],
                                        fleet.host_instances[host.name])
        if host.name in silent:  # sampled all the same, so utilisation resumes per interval
            continue
        collected.append(collection)
        points += n
    exporter.metrics(collected, points)
    return points
