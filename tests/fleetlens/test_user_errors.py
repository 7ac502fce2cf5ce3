"""Every user error of every command is one clear line and a non-zero exit, never a traceback.

The walk goes through the real ``fleetlens`` group (click's CliRunner, in process: one
import of the components for ~80 invocations, where subprocesses would take minutes on a
shared CI machine). Each command in :data:`fleetlens.cli.COMMANDS` gets generic bad inputs
chosen from its own options (an unknown option, a data directory that is a file, a
configuration file that is not TOML), so a command added later is walked too, plus the bad
inputs of its own arguments below. One case also runs the installed console script, which
is what prints a traceback when something escapes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleetlens.cli import COMMANDS, LazyGroup, cli

#: command -> bad argument lists of its own ({data}: an empty data directory, {bad}: a file
#: that is not TOML, {missing}: a path that does not exist).
SPECIFIC: dict[str, list[list[str]]] = {
    "sql": [["select 1 as s, 2 as s", "--data-dir", "{data}"],
            ["selec 1", "--data-dir", "{data}"],
            ["select nope from requests", "--data-dir", "{data}"],
            ["select 1", "--data-dir", "{data}", "--max-rows", "0"]],
    "explain": [["no-such-incident", "--data-dir", "{data}"], ["", "--data-dir", "{data}"]],
    "incidents": [["--data-dir", "{data}", "--since", "last tuesday"]],
    "leaderboard": [["--data-dir", "{data}", "--sla", "fast"]],
    "config": [["check", "{bad}"], ["check", "{missing}"], ["check", "{data}"]],
    "simulate": [["--scenario", "{bad}"], ["--scenario", "{missing}"],
                 ["--start", "garbage", "--endpoint", "127.0.0.1:1"]],
    "health": [["dashboard", "--url", "not-a-url"], ["--timeout", "-1", "dashboard"],
               ["collector", "--address", "127.0.0.1:99999"], ["nosuch"]],
    "demo": [["--minutes", "5", "--no-dashboard", "--data-dir", "{data}"]],
    "collector": [["--data-dir", "{data}", "--grpc-address", "nohost:abc"]],
    "pipeline": [["--data-dir", "{data}", "--window-s", "7"],
                 ["--data-dir", "{data}", "--follow", "--interval", "-1"]],
    "analyze": [["--data-dir", "{data}", "--follow", "--interval", "-1"]],
    "traces": [["--data-dir", "{data}", "--min", "e2e_s"], ["--data-dir", "{data}", "--region",
               "eu"], ["export", "no-such-request", "--data-dir", "{data}"],
               ["compare", "--data-dir", "{data}"],
               ["compare", "--data-dir", "{data}", "--from", "garbage", "--min-latency", "1"],
               ["compare", "--data-dir", "{data}", "--min-latency", "2", "--max-latency", "1"],
               ["compare", "--data-dir", "{data}", "--min-latency", "fast"],
               ["compare", "--data-dir", "{data}", "--min-latency", "-1"],
               ["compare", "--data-dir", "{data}", "--metric", "prefill_s"],
               ["compare", "--data-dir", "{data}", "--from", "2h", "--to", "3h"],
               ["compare", "--data-dir", "{data}", "--min-latency", "1", "--region", "eu"],
               ["--host", "h1", "compare", "--data-dir", "{data}", "--min-latency", "1"],
               ["diff", "no-such-request", "--data-dir", "{data}"],
               ["diff", "--data-dir", "{data}"],
               ["diff", "a", "b", "--data-dir", "{data}", "--window", "1"]],
}


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    data = tmp_path / "data"
    data.mkdir()
    bad = tmp_path / "bad.toml"
    bad.write_text("[collector\nworkers =\n")
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    return {"data": str(data), "bad": str(bad), "missing": str(tmp_path / "missing"),
            "afile": str(afile)}


@pytest.fixture(autouse=True)
def _signals() -> Iterator[None]:
    """Commands that run services install SIGINT/SIGTERM handlers: give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _options(name: str) -> set[str]:
    command = LazyGroup().get_command(click.Context(cli), name)
    assert command is not None
    return {opt for param in command.params for opt in getattr(param, "opts", [])}


def _cases(name: str, paths: dict[str, str]) -> list[list[str]]:
    options = _options(name)
    cases = [["--no-such-option"]]
    if "--data-dir" in options:
        cases.append(["--data-dir", paths["afile"]])
    if "--config" in options:
        cases.append(["--config", paths["bad"], *(
            ["--data-dir", paths["data"]] if "--data-dir" in options else [])])
    for argv in SPECIFIC.get(name, []):
        cases.append([arg.format(**paths) for arg in argv])
    return cases


def _fails_in_one_line(argv: list[str], env: dict[str, str] | None = None) -> None:
    result = CliRunner().invoke(cli, argv, env={"FLEETLENS_DEBUG": None, **(env or {})})
    output = result.output
    assert "Traceback" not in output, (argv, output)
    # A user error ends in click's own exit (a message, then a status), never in an
    # exception escaping the command.
    assert isinstance(result.exception, SystemExit), (argv, repr(result.exception), output)
    assert result.exit_code not in (0, None), (argv, output)
    assert "Error: " in output, (argv, output)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_bad_input_is_one_line_not_a_traceback(name: str, paths: dict[str, str]) -> None:
    for argv in _cases(name, paths):
        _fails_in_one_line([name, *argv])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_unreadable_configuration_in_the_environment_is_one_line(
        name: str, paths: dict[str, str]) -> None:
    """$FLEETLENS_CONFIG naming a broken file: every command that reads the configuration
    says so in one line (the others must not trip over it)."""
    options = _options(name)
    if "--config" not in options:
        pytest.skip(f"`{name}` reads no configuration file")
    argv = [name, *(["--data-dir", paths["data"]] if "--data-dir" in options else [])]
    if name in ("config", "health"):
        argv.append("--help")  # a group: nothing to run
    _fails_in_one_line(argv, env={"FLEETLENS_CONFIG": paths["bad"]})


def test_the_console_script_prints_no_traceback_for_duplicate_sql_columns(
        tmp_path: Path) -> None:
    """The report's own case, as a user runs it."""
    out = subprocess.run([sys.executable, "-m", "fleetlens", "sql", "--data-dir",
                          str(tmp_path), "select 1 as s, 2 as s"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "'s'" in out.stderr, out.stderr


def test_debug_shows_the_traceback_of_an_error_the_handler_turns_into_one_line(
        tmp_path: Path) -> None:
    """FLEETLENS_DEBUG=1: the last-resort handler lets the exception through, so a bug that
    raises a user-error type stays findable."""
    (tmp_path / "state").write_text("")  # a file where the jobs keep their lock
    argv = ["analyze", "--data-dir", str(tmp_path)]
    quiet = CliRunner().invoke(cli, argv, env={"FLEETLENS_DEBUG": None})
    assert isinstance(quiet.exception, SystemExit) and quiet.exit_code == 1, quiet.output
    assert "cannot take the job lock" in quiet.output
    loud = CliRunner().invoke(cli, argv, env={"FLEETLENS_DEBUG": "1"})
    assert type(loud.exception).__name__ == "StorageError", repr(loud.exception)


def test_an_output_file_in_a_folder_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    """explain -o and slo --rules -o into a folder that is not there."""
    import polars as pl

    from fleetlens.analytics.runner import publish
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import DataDir

    root = DataDir(tmp_path / "data")
    start = 1_760_000_000 * 10**9
    incident = pl.DataFrame({
        c.INCIDENT_ID: ["abc123"], c.METRIC: ["e2e_p99_s"], c.SERVICE_NAME: ["chat"],
        c.MODEL: ["m"], c.HOST_NAME: ["h01"], c.START_NS: [start],
        c.END_NS: [start + 600 * 10**9], c.PEAK: [2.0], c.EXPECTED: [1.0],
        c.SEVERITY: ["major"], c.DETECTOR: ["rolling"],
    }).cast(t.table(t.INCIDENTS).empty().schema)
    publish(root, t.INCIDENTS, incident, c.START_NS)
    nowhere = str(tmp_path / "no" / "such" / "folder" / "out.txt")
    _fails_in_one_line(["explain", "abc123", "--data-dir", str(root.root), "-o", nowhere])
    config = tmp_path / "slo.toml"
    config.write_text('[[analytics.slos.services]]\nservice = "chat"\navailability = 0.99\n')
    _fails_in_one_line(["slo", "--config", str(config), "--rules", "-o", nowhere])


def test_a_sql_timeout_while_the_result_streams_is_one_line(tmp_path: Path) -> None:
    """--timeout fires while Arrow reads the result's batches (a cross join of a real
    table): DuckDB's interrupt comes back as a bare OSError there."""
    import polars as pl

    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.storage import DataDir, write_parquet_atomic

    root = DataDir(tmp_path / "data")
    frame = pl.DataFrame({c.NAME: [f"span-{i}" for i in range(20_000)]})
    write_parquet_atomic(frame, root.raw_segment_path("spans", 10**18, "w", 1))
    for fmt in ("csv", "table"):
        _fails_in_one_line(["sql", "--data-dir", str(root.root), "--timeout", "0.3",
                            "--format", fmt, "select * from spans a, spans b, spans c"])
