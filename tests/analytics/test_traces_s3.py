"""``fleetlens traces`` and ``traces export`` read an ``s3://`` data directory through the
storage layer and answer exactly as over the same files on local disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetlens.cli import cli
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, write_bytes_atomic
from tests.s3 import S3Server, s3_server  # noqa: F401 - the fixture `s3`


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.runner import Pipeline
    from tests.pipeline.fleet import make_fleet, write_batches

    data = DataDir(tmp_path_factory.mktemp("traces-s3") / "data")
    write_batches(data, make_fleet(seconds=300))
    Pipeline(data, PipelineConfig()).run_once()
    return Path(data.root)


@pytest.fixture(scope="module")
def remote(local: Path, s3: S3Server) -> str:
    """The local directory's Parquet files copied under an s3:// prefix."""
    url = f"s3://{s3.bucket()}/fleet"
    root = DataDir(url)
    for path in sorted(local.rglob("*.parquet")):
        payload = path.read_bytes()
        write_bytes_atomic(root.root / str(path.relative_to(local)),
                           lambda f, payload=payload: f.write(payload))
    return url


def _out(*args: str) -> str:
    out = CliRunner().invoke(cli, list(args))
    assert out.exit_code == 0, out.output
    return out.stdout


@pytest.mark.parametrize("filters", [
    ["--sort", f"-{c.E2E_S}", "--limit", "20", "--offset", "5"],
    ["--attr", f"{a.GEN_AI_PROMPT_TOKENS}>=300", "--attr", "region=eu"],
    ["--gpu", "GPU-0-1", "--errors"],
])
def test_a_search_over_s3_equals_the_search_over_local_files(
        local: Path, remote: str, filters: list[str]) -> None:
    args = ["--format", "json", "--limit", "10000", *filters]
    here = json.loads(_out("traces", "--data-dir", str(local), *args))
    there = json.loads(_out("traces", "--data-dir", remote, *args))
    assert here and there == here


def test_an_export_from_s3_equals_the_export_from_local_files(local: Path, remote: str) -> None:
    first = json.loads(_out("traces", "--data-dir", str(local), "--format", "json",
                            "--limit", "1"))[0]
    for ident in (first[c.TRACE_ID], first[c.REQUEST_ID]):
        assert _out("traces", "export", ident, "--data-dir", remote) == \
            _out("traces", "export", ident, "--data-dir", str(local))
