"""``fleetlens health``: exit 0 when a component is alive and doing its work, 1 when not.

For container HEALTHCHECKs and Kubernetes exec probes. Each check is one short request (or one
file read) with a deadline, and prints one line saying what it saw:

- ``collector``: the gRPC health service (not behind the ingest token) answers SERVING, over
  the collector's own ``[collector.tls]`` when it serves TLS (:mod:`fleetlens.health_collector`);
- ``dashboard``: Streamlit's ``/_stcore/health`` answers ``ok``;
- ``pipeline``: the ``pipeline --follow`` loop finished a run recently (its heartbeat file
  in ``state/`` is younger than ``--max-age``), so a wedged loop fails the probe, not only a
  dead process.

With no subcommand it checks the components named in ``$FLEETLENS_HEALTH`` (comma separated),
so one image can carry one HEALTHCHECK and each service says what it runs.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import click

from fleetlens.health_collector import check_collector, probe_settings


def check_dashboard(url: str, timeout_s: float) -> str:
    """'ok' or raise: Streamlit's own health endpoint."""
    target = url.rstrip("/") + "/_stcore/health"
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as resp:  # noqa: S310 - probe
            body = resp.read(64).decode(errors="replace").strip()
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"dashboard at {target}: {exc}") from None
    except ValueError as exc:  # urllib's word for a URL it cannot parse ("not-a-url")
        raise click.ClickException(f"dashboard: {exc}; expected http://HOST:PORT") from None
    if body != "ok":
        raise click.ClickException(f"dashboard at {target}: answered {body!r}")
    return body


#: A heartbeat this far ahead of the probe's clock is clock skew NTP would not leave.
FUTURE_TOLERANCE_S = 60.0


def _read_within(path: Any, timeout_s: float | None) -> str:
    """``path.read_text()``, or TimeoutError after ``timeout_s`` (an object store that does
    not answer must fail the probe, not hang it past the orchestrator's own timeout)."""
    if timeout_s is None:
        return str(path.read_text())
    result: list[Any] = []

    def read() -> None:
        try:
            result.append(path.read_text())
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            result.append(exc)

    thread = threading.Thread(target=read, name="heartbeat-read", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not result:
        raise TimeoutError(path)
    if isinstance(result[0], BaseException):
        raise result[0]
    return str(result[0])


def check_pipeline(state_dir: Any, max_age_s: float, now: float | None = None,
                   data_dir: str = "", timeout_s: float | None = None) -> float:
    """The heartbeat's age in seconds, or raise when it is missing, unreadable or too old.

    ``state_dir`` is the data directory's ``state`` folder: a local path or, for an ``s3://``
    data directory, an object path (both read the same way), within ``timeout_s``. A heartbeat
    dated in the future fails. A failure says what to run: the probe's reader is often someone
    wondering why the dashboard shows nothing new."""
    from fleetlens.pipeline.cli import HEARTBEAT_FILE

    follow = f"fleetlens pipeline --follow --data-dir {data_dir or state_dir.parent}"
    path = state_dir / HEARTBEAT_FILE
    try:
        at = float(json.loads(_read_within(path, timeout_s))["unix_s"])
    except TimeoutError:
        raise click.ClickException(
            f"pipeline: reading the heartbeat {path} took more than {timeout_s:g} s (is the "
            "object store reachable?)") from None
    except FileNotFoundError:
        raise click.ClickException(
            f"pipeline: no heartbeat at {path} yet: nothing is following this data "
            f"directory; start `{follow}` (it writes the heartbeat after every run)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"pipeline: unreadable heartbeat {path}: {exc}") from None
    age = (time.time() if now is None else now) - at
    if not math.isfinite(age) or age < -FUTURE_TOLERANCE_S:
        # A heartbeat from the future would read "younger than --max-age" for as long as the
        # future lasts (issue 33): a clock set wrong, or a file written by hand.
        raise click.ClickException(
            f"pipeline: the heartbeat {path} is dated {-age:.0f} s in the future: a clock "
            "is wrong (this host's or the pipeline's), so its age says nothing")
    if age > max_age_s:
        raise click.ClickException(
            f"pipeline: last run finished {age:.0f} s ago (more than {max_age_s:g} s): if "
            f"`{follow}` is not running, start it; if it is, it is stuck (restart it)")
    return age


def _data_dir(data_dir: str | None) -> Any:
    """The data directory, found as every command finds it (a local folder or an ``s3://``
    URL), whether or not it exists yet."""
    from fleetlens.pipeline.cli import resolve_data_dir

    return resolve_data_dir(data_dir, None, must_exist=False)


@click.group(invoke_without_command=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True),
              default=5.0, show_default=True,
              help="Seconds each check may take.")
@click.pass_context
def health(ctx: click.Context, timeout_s: float) -> None:
    """Exit 0 when a component is healthy, 1 with one line saying why not.

    Without a subcommand: check each component named in $FLEETLENS_HEALTH (e.g.
    "collector" or "dashboard,pipeline"), with their default addresses.
    """
    ctx.obj = timeout_s
    if ctx.invoked_subcommand is not None:
        return
    names = [n.strip() for n in os.environ.get("FLEETLENS_HEALTH", "").split(",") if n.strip()]
    if not names:
        raise click.UsageError("name a component, or set FLEETLENS_HEALTH")
    for name in names:
        command = health.get_command(ctx, name)
        if command is None:
            raise click.UsageError(f"FLEETLENS_HEALTH names unknown component {name!r}")
        ctx.invoke(command)


@health.command("collector")
@click.option("--address", default=None,
              help="The collector's OTLP/gRPC HOST:PORT [its grpc_address, a wildcard host "
                   "dialled on 127.0.0.1; default 127.0.0.1:4317].")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="The collector's fleetlens.toml, for [collector.tls] [default: "
                   "$FLEETLENS_CONFIG or ./fleetlens.toml].")
@click.option("--ca", default=None, type=click.Path(dir_okay=False),
              help="CA of the collector's certificate (turns TLS on) [tls.ca_file, else "
                   "tls.cert_file].")
@click.option("--cert", default=None, type=click.Path(dir_okay=False),
              help="Client certificate for mutual TLS [the collector's tls.cert_file].")
@click.option("--key", default=None, type=click.Path(dir_okay=False),
              help="Key of --cert [the collector's tls.key_file].")
@click.option("--server-name", default=None,
              help="Name to check in the certificate [tls.server_name, else the host dialled].")
@click.pass_obj
def collector(timeout_s: float, address: str | None, config_file: str | None, ca: str | None,
              cert: str | None, key: str | None, server_name: str | None) -> None:
    """The collector's gRPC health service answers SERVING (over TLS when it serves TLS)."""
    target, tls, token = probe_settings(config_file, address, ca, cert, key, server_name)
    status = check_collector(target, timeout_s, tls, token)
    click.echo(f"collector {target}{' (TLS)' if tls else ''}: {status}")


@health.command("dashboard")
@click.option("--url", default="http://127.0.0.1:8501", show_default=True,
              help="The dashboard's base URL.")
@click.pass_obj
def dashboard(timeout_s: float, url: str) -> None:
    """Streamlit's /_stcore/health answers ok."""
    click.echo(f"dashboard {url}: {check_dashboard(url, timeout_s)}")


@health.command("pipeline")
@click.option("--data-dir", default=None,
              help="Data directory [env FLEETLENS_DATA, else data_dir of the configuration].")
@click.option("--max-age", "max_age_s", type=float, default=300.0, show_default=True,
              help="Seconds since the last finished run before the pipeline counts as stuck.")
@click.pass_obj
def pipeline(timeout_s: float, data_dir: str | None, max_age_s: float) -> None:
    """A `pipeline --follow` run finished less than --max-age seconds ago."""
    root = _data_dir(data_dir)
    age = check_pipeline(root.state, max_age_s, data_dir=str(root.root), timeout_s=timeout_s)
    click.echo(f"pipeline: last run finished {age:.0f} s ago")
