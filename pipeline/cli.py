"""``fleetlens pipeline`` and ``fleetlens compact``."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.output import format_option
from fleetlens.pipeline.schema.settings import (
    DATA_DIR_HELP,
    ConfigError,
    load_section,
    read_config,
)
from fleetlens.pipeline.storage import DataDir, StorageError, write_json_atomic

if TYPE_CHECKING:
    from fleetlens.pipeline.runner import Pipeline, RunSummary

_DATA_DIR_HELP = DATA_DIR_HELP
#: Median export delays (seconds) outside this range are reported host by host: exporters
#: batch for a few seconds, so more than a minute, or a span received before it ended, is
#: clock skew, a stalled exporter or a replay of old data.
#: DATA_DIR/state/<this>: when the last pipeline run finished (see write_heartbeat)
HEARTBEAT_FILE = "pipeline-heartbeat.json"
EXPORT_DELAY_OK_S = (-1.0, 60.0)


def resolve_data_dir(data_dir: str | None, config_file: str | None, *,
                     must_exist: bool = True) -> DataDir:
    """The data directory a command works on (see :meth:`DataDir.from_env`), as a clean
    command-line error when it cannot be found or, with ``must_exist``, does not exist."""
    try:
        # The configuration is read even when --data-dir makes it unneeded: a file the user
        # named (or $FLEETLENS_CONFIG names) that is broken must not pass in silence.
        read_config(config_file)
        root = DataDir.from_env(data_dir, config_file)
        # A service may start before its directory exists, never on a file in its place.
        local_file = not root.remote and root.root.exists()
        return root.require() if must_exist or local_file else root
    except (ConfigError, StorageError) as exc:
        raise click.ClickException(str(exc)) from None


def load_pipeline_config(path: str | None, **overrides: object) -> PipelineConfig:
    """The ``[pipeline]`` section: defaults, then the config file, then FLEETLENS_PIPELINE__*
    variables, then command-line overrides (those that are not None)."""
    return load_section(PipelineConfig, "pipeline", path, overrides=overrides)


def _progress_printer(enabled: bool):  # noqa: ANN202 - a callback
    """A progress callback: a rich bar on a terminal, nothing otherwise."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), "hours", TimeElapsedColumn(), transient=True)
    tasks: dict[str, int] = {}

    def report(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], completed=done, total=total)

    return bar, report


#: Called after each successful run with the data dir, the config file and the run summary
#: (e.g. analytics, wired in by the fleetlens command line, since pipeline may not import it).
AfterRun = Callable[[DataDir, "str | None", "RunSummary"], None]


def make_pipeline_command(after_run: AfterRun | None = None) -> click.Command:
    """Build the ``pipeline`` command; ``after_run`` runs after every run that wrote rows
    when ``--follow`` is given (or ``--analyze`` asks for it)."""

    @click.command("pipeline")
    @click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
                  help=_DATA_DIR_HELP)
    @click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                  help="fleetlens.toml [default: $FLEETLENS_CONFIG or ./fleetlens.toml].")
    @click.option("--window-s", type=int, default=None, help="Window length (10, 60, 300, ...).")
    @click.option("--full", is_flag=True, help="Recompute everything instead of only new data.")
    @click.option("--follow", is_flag=True, help="Keep running, processing new data as it comes.")
    @click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=None,
                  help="Seconds between runs with --follow [default: pipeline.follow_interval_s].")
    @click.option("--progress/--no-progress", default=None,
                  help="Show a progress bar [default: when stderr is a terminal].")
    @format_option("table", "json")
    @click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
    @click.option("--analyze/--no-analyze", "analyze", default=None, hidden=after_run is None,
                  help="After each run with new data, detect incidents and post new ones to "
                       "the [analytics] webhooks and stdout [default: with --follow].")
    @click.option("--runner", type=click.Choice(RUNNERS), default="local", show_default=True,
                  help="Run the hours in this process (local) or as Ray tasks (ray: same "
                       "files; needs the 'ray' extra).")
    @click.option("--ray-address", default=None, metavar="HOST:PORT",
                  help="With --runner ray: the head of the Ray cluster to join [default: "
                       "$RAY_ADDRESS, else start Ray on this machine].")
    @click.option("--replay", is_flag=True,
                  help="The telemetry is a replay of the past (e.g. `fleetlens simulate` "
                       "faster than real time): its export delays are not reported.")
    def pipeline(data_dir: str | None, config_file: str | None, window_s: int | None,
                 full: bool, follow: bool, interval: float | None, progress: bool | None,
                 fmt: str, as_json: bool, analyze: bool | None, runner: str,
                 ray_address: str | None, replay: bool) -> None:
        """Turn raw telemetry into requests, samples, windows and per-request energy.

        Processes only raw segments that are new since the last run (state in
        DATA_DIR/state/pipeline.json); rerunning over the same data gives identical files.
        With --follow it keeps running and, after each run with new data, also detects
        incidents (baselines, incidents, causes) and posts the new ones.
        """
        hook = after_run if (follow if analyze is None else analyze) else None
        job = make_job(runner, ray_address)
        _run_pipeline(data_dir, config_file, window_s, full, follow, interval, progress,
                      as_json or fmt == "json", hook, job, replay=replay)

    return pipeline


#: ``--runner`` choices: this process, or Ray tasks (:mod:`pipeline.ray_runner`)
RUNNERS = ("local", "ray")
#: What builds the job: (data dir, config, progress callback) -> a Pipeline
JobFactory = Callable[..., "Pipeline"]
RAY_MISSING = ("--runner ray needs Ray, which could not be imported ({error}); install it "
               "with `pip install 'fleetlens[ray]'` (ray==2.60.0)")


def make_job(runner: str, ray_address: str | None) -> JobFactory:
    """The job class for ``--runner`` (imports Ray only for ``ray``), as a clean
    command-line error when the options do not fit or Ray is not installed."""
    if runner == "local":
        if ray_address is not None:
            raise click.UsageError("--ray-address needs --runner ray")
        from fleetlens.pipeline.runner import Pipeline

        return Pipeline
    try:
        from fleetlens.pipeline.ray_runner import RayPipeline
    except ImportError as exc:
        raise click.ClickException(RAY_MISSING.format(error=exc)) from None
    return lambda dd, cfg, progress=None: RayPipeline(dd, cfg, progress, address=ray_address)


def _run_pipeline(data_dir: str | None, config_file: str | None, window_s: int | None,
                  full: bool, follow: bool, interval: float | None, progress: bool | None,
                  as_json: bool, after_run: AfterRun | None,
                  job_factory: JobFactory | None = None, *, replay: bool = False) -> None:
    if job_factory is None:
        from fleetlens.pipeline.runner import Pipeline

        job_factory = Pipeline
    try:
        cfg = load_pipeline_config(config_file, window_s=window_s)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None
    # A live --follow may start before the collector has made the directory.
    root = resolve_data_dir(data_dir, config_file, must_exist=not follow)
    show = sys.stderr.isatty() if progress is None else progress
    bar, report = _progress_printer(show)
    job = job_factory(root, cfg, progress=report)
    pause = interval if interval is not None else cfg.follow_interval_s
    stop = _StopFlag(enabled=follow)
    first = True
    while True:
        if bar is not None:
            bar.start()
        try:
            summary = job.run_once(full=full and first)
        except StorageError as exc:  # e.g. a damaged state file: says what to do
            if not follow:
                raise click.ClickException(str(exc)) from None
            click.echo(f"pipeline run failed, retrying in {pause:g} s: {exc}", err=True)
        except Exception as exc:  # noqa: BLE001 - a live monitor reports and retries
            if not follow:
                raise
            click.echo(f"pipeline run failed, retrying in {pause:g} s: {exc!r}", err=True)
        else:
            write_heartbeat(root)
            _print_summary(summary, as_json, replay=replay)
            if after_run is not None and (first or summary.new_rows):
                _after(after_run, root, config_file, summary, follow)
            first = False
        finally:
            if bar is not None:
                bar.stop()
        if not follow or stop.wait(pause):
            if follow:
                click.echo("stopped", err=True)
            return


def write_heartbeat(root: DataDir) -> None:
    """Say that a run finished, for `fleetlens health pipeline` (a container probe): a
    follow loop that is alive but wedged stops beating and fails its probe."""
    write_json_atomic(root.state / HEARTBEAT_FILE, {"unix_s": time.time()})


def _after(after_run: AfterRun, root: DataDir, config_file: str | None, summary: RunSummary,
           follow: bool) -> None:
    try:
        after_run(root, config_file, summary)
    except Exception as exc:  # noqa: BLE001 - a live monitor reports and goes on
        if not follow:
            raise
        click.echo(f"analysis after the pipeline run failed: {exc!r}", err=True)


pipeline = make_pipeline_command()


class _StopFlag:
    """SIGINT/SIGTERM set a flag in --follow mode: the current run finishes, then we exit."""

    def __init__(self, *, enabled: bool) -> None:
        self.stopped = False
        if enabled:
            signal.signal(signal.SIGINT, self._set)
            signal.signal(signal.SIGTERM, self._set)

    def _set(self, _signum: int, _frame: object) -> None:
        self.stopped = True

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as a stop was asked for."""
        deadline = time.monotonic() + seconds
        while not self.stopped and time.monotonic() < deadline:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        return self.stopped


def _print_summary(summary, as_json: bool,  # noqa: ANN001 - RunSummary
                   replay: bool = False) -> None:
    if as_json:
        click.echo(json.dumps(summary.as_dict(), sort_keys=True))
        return
    written = ", ".join(f"{k} {v}" for k, v in sorted(summary.rows_written.items()))
    click.echo(f"{summary.new_segments} new segments ({summary.new_rows} rows, "
               f"{summary.too_late_rows} too late), {summary.dirty_hours} hours recomputed "
               f"in {summary.seconds:.2f} s; rows written: {written or 'none'}")
    if summary.kept_host_hours or summary.kept_host_hours_phase2:
        click.echo(f"  host-hours kept (no new data from those hosts), not recomputed: "
                   f"{summary.kept_host_hours} of points, {summary.kept_host_hours_phase2} "
                   "of energy and windows")
    delays = summary.export_delay_s
    if not delays or replay:  # a replay's spans all arrive late: that is no news
        return
    low, high = min(delays.values()), max(delays.values())
    click.echo(f"  export delay (span end to receipt, median per host): {low:.1f} to "
               f"{high:.1f} s over {len(delays)} hosts")
    # Only where the delay says something is off, and each verdict once: a replayed fleet
    # of 50 hosts is one line, not 50 saying the same.
    ahead = {h: d for h, d in delays.items() if d < EXPORT_DELAY_OK_S[0]}
    behind = {h: d for h, d in delays.items() if d > EXPORT_DELAY_OK_S[1]}
    if ahead:
        click.echo(_delay_line(ahead, "runs ahead of the collector's",
                               "run ahead of the collector's"))
    if behind:
        click.echo(_delay_line(
            behind, "runs behind the collector's, its exporter stalls, or this is a replay",
            "run behind the collector's, their exporters stall, or this is a replay "
            "(`pipeline --replay` says so)"))


def _delay_line(hosts: dict[str, float], one: str, many: str) -> str:
    """``host h: median export delay D s: its clock ...`` for one host, the hosts and the
    range of their delays with ``many`` for several."""
    if len(hosts) == 1:
        [(host, delay)] = hosts.items()
        return f"  host {host}: median export delay {delay:.1f} s: its clock {one}"
    names = sorted(hosts)
    listed = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    low, high = min(hosts.values()), max(hosts.values())
    return (f"  {len(names)} hosts ({listed}): median export delay {low:.1f} to {high:.1f} s: "
            f"their clocks {many}")


@click.command()
@click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
              help=_DATA_DIR_HELP)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="fleetlens.toml [default: $FLEETLENS_CONFIG or ./fleetlens.toml].")
@click.option("--dry-run", is_flag=True, help="Only print what would be merged or deleted.")
@format_option("table", "json")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
@click.option("--every", type=click.FloatRange(min=60), default=None, metavar="SECONDS",
              help="Keep running, once every SECONDS (a service instead of a cron job).")
def compact(data_dir: str | None, config_file: str | None, dry_run: bool, fmt: str,
            as_json: bool, every: float | None) -> None:
    """Merge small raw segments into one file per hour and apply retention.

    Raw data (and the per-request/per-sample tables) are kept pipeline.raw_retention_days,
    windows pipeline.windows_retention_days. Safe to run beside the collector and the
    pipeline: only hours older than pipeline.compact_min_age_s are merged, and it waits
    for a running pipeline or analytics step (the data directory's job lock).
    """
    as_json = as_json or fmt == "json"
    from fleetlens.pipeline.compact import compact as run_compact

    try:
        cfg = load_pipeline_config(config_file)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None
    root = resolve_data_dir(data_dir, config_file, must_exist=every is None)
    stop = _StopFlag(enabled=every is not None)
    while True:
        try:
            summary = run_compact(root, cfg, dry_run=dry_run)
        except StorageError as exc:
            if every is None:
                raise click.ClickException(str(exc)) from None
            click.echo(f"compact failed, trying again in {every:g} s: {exc}", err=True)
        else:
            _print_compact(summary, dry_run, as_json)
        if every is None or stop.wait(every):
            return


def _print_compact(summary, dry_run: bool, as_json: bool) -> None:  # noqa: ANN001
    if as_json:
        click.echo(json.dumps(summary.as_dict(), sort_keys=True))
        return
    for line in summary.details:
        click.echo(line)
    verb = "would merge" if dry_run else "merged"
    click.echo(f"{verb} {summary.merged_files} segments into {summary.written_files} files "
               f"({summary.bytes_before} -> {summary.bytes_after} bytes); expired "
               f"{summary.expired_raw_hours} raw hours, {summary.expired_derived_files} "
               f"derived partitions"
               + (f"; removed {summary.leftovers_removed} segments an interrupted compaction "
                  "had already merged" if summary.leftovers_removed else ""))
