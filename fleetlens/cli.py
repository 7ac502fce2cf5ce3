"""The ``fleetlens`` console script.

Subcommands live with their components (``pipeline/cli.py``, ``collector/cli.py``, ...) as
click commands. This module only knows where they are: each is imported when it is run (or
asked for ``--help``), so ``fleetlens sql`` never loads Streamlit or Prophet.

To add a subcommand, write it as a click command in its component and add one line to
:data:`COMMANDS`.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from fleetlens import __version__

#: name -> ("module:attribute", one-line help shown by ``fleetlens --help``).
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("fleetlens.collector.agent.cli:agent",
              "Host agent: GPU (NVML) and vLLM metrics to OTLP."),
    "config": ("fleetlens.config_cli:config", "Check and print the effective configuration."),
    "sql": ("fleetlens.pipeline.sql_cli:sql",
            "Run a SQL query over the tables in a data directory."),
    "dashboard": ("fleetlens.dashboard.cli:dashboard",
                  "Serve the web dashboard (Streamlit, 127.0.0.1)."),
    "health": ("fleetlens.health:health",
               "Exit 0 when the collector, dashboard or pipeline is healthy (probes)."),
    "demo": ("fleetlens.demo:demo", "Run everything on a simulated fleet; open the dashboard."),
    "simulate": ("fleetlens.simulator.cli:simulate",
                 "Simulate a vLLM fleet with incidents, send OTLP."),
    "pipeline": ("fleetlens.pipeline_cmd:pipeline",
                 "Raw telemetry to requests, windows and energy; --follow also detects."),
    "compact": ("fleetlens.pipeline.cli:compact", "Merge small raw segments; apply retention."),
    "collector": ("fleetlens.collector.cli:collector",
                  "Receive OTLP (gRPC and HTTP) into raw Parquet."),
    "analyze": ("fleetlens.analytics.cli:analyze",
                "Baselines, incidents and causes; post new incidents."),
    "incidents": ("fleetlens.analytics.cli:incidents",
                  "List incidents with severity and top cause."),
    "explain": ("fleetlens.analytics.cli:explain",
                "Explain an incident: causes, evidence, provenance."),
    "baselines": ("fleetlens.analytics.cli:baselines", "Show series against their baseline bands."),
    "slo": ("fleetlens.analytics.slos.cli:slo",
            "SLOs: compliance, error budget left, burn rates, firing alerts; --rules."),
    "capacity": ("fleetlens.capacity_cmd:capacity",
                 "Capacity per pool: knee, goodput/GPU, headroom, MBU/MFU; --what-if."),
    "exporter": ("fleetlens.analytics.exporter_cli:exporter",
                 "Serve derived signals (latency, J/token, incidents) for Prometheus."),
    "leaderboard": ("fleetlens.analytics.cli:leaderboard",
                    "Rank model/GPU/config: latency, tok/s, J/token."),
    "traces": ("fleetlens.analytics.traces.cli:traces",
               "Search requests and traces (filters, sort, pages); export one as OTLP/JSON."),
}

#: Set (to anything but empty) to see the traceback behind a one-line error.
DEBUG_ENV = "FLEETLENS_DEBUG"

#: third-party import name -> the extra of pyproject.toml that installs it
EXTRA_OF_MODULE: dict[str, str] = {
    "pynvml": "agent",
    "duckdb": "server", "polars": "server", "pyarrow": "server", "numpy": "server",
    "rich": "server", "grpc_health": "server", "prometheus_client": "agent",
    "prophet": "prophet",
    "streamlit": "dashboard", "plotly": "dashboard",
}


def missing_extra(command: str, exc: ModuleNotFoundError) -> click.ClickException | None:
    """A one-line "install this extra" error when ``exc`` is a dependency of an extra."""
    top = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    return click.ClickException(
        f"`fleetlens {command}` needs {top}, which this installation lacks: it comes with "
        f"the '{extra}' extra (pip install 'fleetlens[{extra}]', or 'fleetlens[all]')")


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        target, _ = COMMANDS[cmd_name]
        module_name, _, attribute = target.partition(":")
        try:
            command = getattr(importlib.import_module(module_name), attribute)
        except ModuleNotFoundError as exc:
            hint = missing_extra(cmd_name, exc)
            if hint is None:
                raise
            raise hint from None
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; a data-directory or configuration problem is one line, not a
        traceback (each command handles its usual ones, this catches the rest).

        With ``FLEETLENS_DEBUG=1`` they propagate with their traceback: one of them raised
        where no user input explains it is a bug, and the line alone would hide where."""
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:  # a lazy import inside the command
            hint = missing_extra(ctx.invoked_subcommand or "", exc)
            if hint is None:
                raise
            raise hint from None
        except Exception as exc:
            from fleetlens.pipeline.schema.settings import ConfigError

            # Only a command that loaded the storage layer can raise its error; importing it
            # here would pull PyArrow into the agent, which does not install it.
            storage = sys.modules.get("fleetlens.pipeline.storage")
            user_error = isinstance(exc, ConfigError) or (
                storage is not None and isinstance(exc, storage.StorageError))
            if user_error and not os.environ.get(DEBUG_ENV):
                raise click.ClickException(str(exc)) from None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help comes from the table above so --help imports no component.
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetlens")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default=None, help="Log level of the services [env FLEETLENS_LOG_LEVEL].")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="Service logs as text or one JSON object per line "
                   "[env FLEETLENS_LOG_FORMAT].")
def cli(log_level: str | None, log_format: str | None) -> None:
    """fleetlens: find out why your LLM inference fleet got slow.

    Ingests OpenTelemetry spans (vLLM, any OTel server) and GPU/engine telemetry, computes
    per-request phases, windows, energy and baselines, and explains latency spikes.

    Data lives in one directory: --data-dir, else $FLEETLENS_DATA, else data_dir in the
    configuration file, else ./fleetlens-data.
    Configuration: fleetlens.toml (--config, else $FLEETLENS_CONFIG) with FLEETLENS_*
    environment overrides; see `fleetlens config check --help`.
    """
    # Through the environment, so forked collector workers and child processes inherit it;
    # pipeline.schema.logsetup reads it (the names are defined there).
    from fleetlens.pipeline.schema import logsetup

    for value, variable in ((log_level, logsetup.LEVEL_ENV), (log_format, logsetup.FORMAT_ENV)):
        if value is not None:
            os.environ[variable] = value


def main() -> None:
    """Entry point of the console script."""
    cli(prog_name="fleetlens")


if __name__ == "__main__":
    main()
