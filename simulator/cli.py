"""``fleetlens simulate``: run a scenario and send its telemetry to a collector."""

from __future__ import annotations

import click

from fleetlens.simulator.scenario import ScenarioError, load_scenario


def _receiver_reachable(endpoint: str, timeout_s: float) -> bool:
    import grpc

    channel = grpc.insecure_channel(endpoint)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


@click.command("simulate")
@click.option("--scenario", "scenario_path", required=True,
              type=click.Path(exists=True, dir_okay=False), help="Scenario TOML file.")
@click.option("--endpoint", default="127.0.0.1:4317", show_default=True,
              help="OTLP/gRPC endpoint (host:port) of the collector.")
@click.option("--speed", type=float, default=None,
              help="Simulated seconds per wall second (default: as fast as possible).")
@click.option("--max-speed", is_flag=True, help="Run as fast as possible (the default).")
@click.option("--ground-truth", "ground_truth", type=click.Path(dir_okay=False),
              help="Write the injected incidents as JSON here.")
@click.option("--seed", type=int, default=None, help="Random seed (default: the scenario's).")
@click.option("--start", default=None,
              help="Virtual start time instead of [fleet].start: ISO time, now, now-6h.")
@click.option("--token", envvar="FLEETLENS_SIMULATE_TOKEN", default=None,
              help="Bearer token for a collector with auth_tokens [env FLEETLENS_SIMULATE_TOKEN].")
@click.option("--connect-timeout", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True,
              help="Seconds to wait for the collector before giving up.")
def simulate(scenario_path: str, endpoint: str, speed: float | None, max_speed: bool,
             ground_truth: str | None, seed: int | None, start: str | None,
             token: str | None, connect_timeout: float) -> None:
    """Simulate a vLLM fleet with injected incidents and send its OTLP telemetry.

    Spans (llm_request, gateway), GPU and engine metrics go to ENDPOINT over OTLP/gRPC on a
    virtual clock; --ground-truth lists what was injected (cause, subject, window).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fleetlens.simulator.run import run
    from fleetlens.simulator.scenario import parse_start

    if speed is not None and max_speed:
        raise click.UsageError("--speed and --max-speed exclude each other")
    if speed is not None and speed <= 0:
        raise click.BadParameter("must be positive", param_hint="--speed")
    try:
        scenario = load_scenario(scenario_path)
        start_ns = parse_start(start) if start else None
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from None
    if not _receiver_reachable(endpoint, connect_timeout):
        raise click.ClickException(f"no OTLP/gRPC receiver at {endpoint} "
                                   f"(waited {connect_timeout:g} s); start the collector first")
    console = Console(stderr=True)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(),
               TextColumn("{task.fields[clock]}"), TextColumn("{task.fields[counts]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(scenario.name, total=scenario.duration_s + scenario.drain_s,
                            clock="", counts="")

        def update(p) -> None:
            bar.update(task, completed=p.sim_s, clock=f"{p.sim_s:,.0f}/{p.end_s:,.0f} s",
                       counts=f"{p.requests:,} req  {p.spans:,} spans  {p.points:,} points")

        try:
            result = run(scenario, endpoint, seed=seed, speed=speed, start_ns=start_ns,
                         ground_truth_path=ground_truth, on_progress=update, token=token)
        except ScenarioError as exc:
            raise click.ClickException(str(exc)) from None
        bar.update(task, completed=scenario.duration_s + scenario.drain_s)  # drained early
    e = result.exported
    console.print(
        f"simulated {result.sim_s:,.0f} s in {result.wall_s:,.1f} s "
        f"({result.sim_s / max(result.wall_s, 1e-9):,.0f}x): {result.requests:,} requests, "
        f"{e.spans_sent:,} spans and {e.points_sent:,} metric points sent"
        + (f"; {result.rejected:,} rejected (too long)" if result.rejected else "")
        + (f"; {result.unfinished:,} unfinished at the end" if result.unfinished else ""))
    if ground_truth:
        console.print(f"ground truth: {ground_truth} "
                      f"({len(result.ground_truth['incidents'])} incidents)")
    if e.spans_failed or e.points_failed:
        raise click.ClickException(f"exports failed for {e.spans_failed:,} spans and "
                                   f"{e.points_failed:,} points")
    if e.spans_rejected or e.points_rejected:
        raise click.ClickException(
            f"the collector rejected {e.spans_rejected:,} spans and {e.points_rejected:,} "
            f"points: {e.last_rejection} (is the scenario's start within the collector's "
            f"max_clock_skew_s? try --start now-2h)")
