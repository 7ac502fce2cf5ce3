"""The console script, run as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic


def fleetlens(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetlens", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_help_lists_only_commands_that_exist() -> None:
    from fleetlens.cli import COMMANDS, LazyGroup

    out = fleetlens("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout
        assert LazyGroup().get_command(None, name) is not None  # type: ignore[arg-type]


def test_sql_does_not_import_heavy_components(tmp_path: Path) -> None:
    code = ("import sys; from fleetlens.cli import cli; "
            "sys.argv=['fleetlens','sql','--data-dir',sys.argv[1],'--format','json',"
            "'select 41 + 1 as answer'];\n"
            "try: cli()\nexcept SystemExit as exit: status = exit.code\n"
            "heavy = ('streamlit', 'prophet', 'fleetlens.analytics', 'fleetlens.dashboard')\n"
            "print(status, [m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert json.loads(lines[0]) == [{"answer": 42}], out.stdout + out.stderr  # it ran
    assert lines[-1] == "0 []", out.stdout + out.stderr


def test_config_check_prints_and_rejects(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[collector]\nworkers = 2\n")
    out = fleetlens("config", "check", str(good), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["collector"]["workers"] == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[collector]\nworkers = -2\n")
    out = fleetlens("config", "check", str(bad))
    assert out.returncode != 0
    assert "collector.workers" in out.stderr


def test_config_check_prints_toml_it_reads_back(tmp_path: Path) -> None:
    """Every key is shown (unset ones as comments), and keys that need quotes get them."""
    given = tmp_path / "given.toml"
    given.write_text('[analytics.hbm_gbps]\n"NVIDIA H100 80GB HBM3" = 3350.0\n'
                     '[analytics.model_shapes]\n"llama-3.1-8b" = "32,4096,8,128,2"\n')
    printed = fleetlens("config", "check", str(given))
    assert printed.returncode == 0, printed.stderr
    assert "# tls_ca_file = (unset)" in printed.stdout  # [agent]: a key that exists, unset
    again = tmp_path / "again.toml"
    again.write_text(printed.stdout)
    reread = fleetlens("config", "check", str(again), "--format", "json")
    assert reread.returncode == 0, reread.stderr
    first = fleetlens("config", "check", str(given), "--format", "json")
    assert json.loads(reread.stdout) == json.loads(first.stdout)
    assert json.loads(first.stdout)["analytics"]["hbm_gbps"] == {"NVIDIA H100 80GB HBM3": 3350.0}


def test_config_check_redacts_secrets(tmp_path: Path) -> None:
    path = tmp_path / "secret.toml"
    path.write_text('[collector]\nauth_tokens = ["s3cret-token"]\n')
    for fmt in ("toml", "json"):
        out = fleetlens("config", "check", str(path), "--format", fmt)
        assert out.returncode == 0, out.stderr
        assert "s3cret-token" not in out.stdout
        assert "<redacted>" in out.stdout


def test_sql_over_an_empty_and_a_filled_data_dir(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "d")
    missing = fleetlens("sql", "--data-dir", str(root.root), "select count(*) from spans")
    assert missing.returncode == 1 and "no data directory at" in missing.stderr  # a typo
    assert not root.root.exists()  # is not answered with "nothing yet", nor created
    root.root.mkdir()
    out = fleetlens("sql", "--data-dir", str(root.root), "select count(*) as n from spans",
                    "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"n": 0}]
    frame = pl.DataFrame({c.TRACE_ID: ["0af7651916cd43dd8448eb211c80319c"],
                          c.SPAN_ID: ["b7ad6b7169203331"], c.NAME: ["llm_request"]})
    write_parquet_atomic(frame, root.raw_segment_path("spans", 10**18, "w", 1))
    out = fleetlens("sql", "--data-dir", str(root.root), "select name from spans",
                    "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["name", "llm_request"]
    out = fleetlens("sql", "--data-dir", str(root.root), "select * from spans")
    assert "llm_request" in out.stdout and "(1 row)" in out.stdout


def test_sql_unknown_table_lists_tables(tmp_path: Path) -> None:
    out = fleetlens("sql", "--data-dir", str(tmp_path), "select * from nope")
    assert out.returncode == 1
    assert "nope does not exist" in out.stderr
    assert "fleetlens tables: spans, metric_points" in out.stderr


def test_sql_runs_read_only_queries_only(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "d")
    segment = root.raw_segment_path("spans", 10**18, "w", 1)
    write_parquet_atomic(pl.DataFrame({c.NAME: ["llm_request"]}), segment)
    before = segment.read_bytes()
    for query in (f"copy (select 1 as x) to '{segment}' (format parquet)",
                  f"attach '{tmp_path / 'other.db'}' as other",
                  "create table t as select 1", "select 1; select 2"):
        out = fleetlens("sql", "--data-dir", str(root.root), query)
        assert out.returncode == 2, (query, out.stdout, out.stderr)
        assert "read-only" in out.stderr or "one query" in out.stderr, out.stderr
    assert segment.read_bytes() == before and not (tmp_path / "other.db").exists()
    out = fleetlens("sql", "--data-dir", str(root.root), "describe spans", "--format", "csv")
    assert out.returncode == 0 and "name,VARCHAR" in out.stdout, out.stderr


def test_one_shot_commands_refuse_a_data_dir_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    for command in (["pipeline"], ["compact"], ["analyze"], ["incidents"], ["baselines"],
                    ["leaderboard"], ["explain", "inc-1"]):
        out = fleetlens(*command, "--data-dir", str(missing))
        assert out.returncode == 1, (command, out.stdout, out.stderr)
        assert f"no data directory at {missing}" in out.stderr, (command, out.stderr)
        assert "Traceback" not in out.stderr
    assert not missing.exists()  # none of them made it
    afile = tmp_path / "afile"
    afile.write_text("")
    out = fleetlens("pipeline", env={"PATH": "/usr/bin", "FLEETLENS_DATA": str(afile)})
    assert out.returncode == 1 and "is not a directory" in out.stderr, out.stderr


def test_a_data_dir_the_jobs_cannot_write_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (root / "state").write_text("")  # a file where the jobs keep their state and lock
    for command in ("pipeline", "compact", "analyze", "incidents"):
        out = fleetlens(command, "--data-dir", str(root))
        assert out.returncode == 1, (command, out.stderr)
        assert "cannot take the job lock" in out.stderr and "Traceback" not in out.stderr


def test_sql_schema_queries_see_every_table(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "d")
    root.root.mkdir()
    out = fleetlens("sql", "--data-dir", str(root.root), "show tables", "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert {"spans", "requests", "windows", "incidents"} <= set(out.stdout.split())
