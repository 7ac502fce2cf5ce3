"""analytics.run over a data directory, the CLI commands and webhook delivery."""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.runner import read_table, run, state_dir
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema import validate
from tests.analytics.synthetic import FleetSpec, Injected, generate
from tests.analytics.synthetic_io import write_tables

H = 3600


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    from fleetlens.pipeline.storage import DataDir

    root = DataDir(tmp_path_factory.mktemp("analytics") / "data")
    data = generate(FleetSpec(hosts=3, gpus_per_host=2, duration_s=3 * H, seed=5), [
        Injected("kv_cache_pressure", "host_name=h01", 2 * H, 900)])
    write_tables(data, root)
    return root, data


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.status == 200:
            type(self).received.append(json.loads(body))
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def webhook():
    _Hook.received = []
    _Hook.status = 200
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", _Hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_run_publishes_tables_and_posts_once(filled, webhook, tmp_path) -> None:
    root, data = filled
    url, hook = webhook
    cfg = dataclasses.replace(AnalyticsConfig(), webhooks=(url,))
    hook.status = 500  # down: nothing is marked delivered
    first = run(root, cfg)
    assert first.new_incidents and first.post_errors and hook.received == []
    hook.status = 200
    second = run(root, cfg)
    assert second.new_incidents == first.new_incidents
    assert second.posted == len(first.new_incidents) and not second.post_errors
    third = run(root, cfg)
    assert third.new_incidents == [] and len(hook.received) == len(first.new_incidents)
    body = hook.received[0]
    assert body["type"] == "fleetlens.incident"
    assert body["causes"][0][c.CAUSE] == "kv_cache_pressure"
    assert body["causes"][0][c.SUBJECT] == "host_name=h01"
    assert isinstance(body["causes"][0][c.EVIDENCE], dict)
    for table in (t.INCIDENTS, t.CAUSES, t.BASELINES):
        validate(read_table(root, table), table)
    prov = json.loads((state_dir(root) / "provenance.json").read_text())
    assert prov["row_counts"][t.REQUESTS] == data.requests.height
    assert len(prov["input_sha256"]) == 64
    # rerunning over the same input gives the same incidents
    assert read_table(root, t.INCIDENTS)[c.INCIDENT_ID].to_list() == first.new_incidents


def test_cli_incidents_explain_baselines(filled) -> None:
    root, _ = filled
    runner = CliRunner()
    args = ["--data-dir", str(root.root)]
    out = runner.invoke(cli, ["incidents", *args, "--format", "json", "--refresh"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert rows and rows[0][c.CAUSE] == "kv_cache_pressure"
    ident = rows[0][c.INCIDENT_ID]
    table = runner.invoke(cli, ["incidents", *args])
    assert ident in table.output and "kv_cache_pressure" in table.output
    since = runner.invoke(cli, ["incidents", *args, "--since", "2099-01-01T00:00Z"])
    assert "0 incidents" in since.output
    text = runner.invoke(cli, ["explain", ident[:8], *args])
    assert text.exit_code == 0, text.output
    for needle in ("kv_cache_pressure", "host_name=h01", "queue:", "input sha256",
                   "Slowest requests", "data range"):
        assert needle in text.output
    md = runner.invoke(cli, ["explain", ident, *args, "--format", "markdown"])
    assert md.output.startswith(f"# fleetlens incident `{ident}`")
    page = runner.invoke(cli, ["explain", ident, *args, "--format", "html"])
    assert "<svg" in page.output and "<script" not in page.output
    missing = runner.invoke(cli, ["explain", "ffffffff", *args])
    assert missing.exit_code == 1 and "no incident" in missing.output
    base = runner.invoke(cli, ["baselines", *args, "--series", "e2e_p99_s", "--format",
                               "json"])
    rows = json.loads(base.output)
    assert rows and all("e2e_p99_s" in r[c.SERIES] for r in rows)


def test_empty_data_dir_is_quiet(tmp_path) -> None:
    from fleetlens.pipeline.storage import DataDir

    result = run(DataDir(tmp_path / "empty"), AnalyticsConfig())
    assert result.analysis.incidents.height == 0
    assert read_table(DataDir(tmp_path / "empty"), t.INCIDENTS).height == 0
    assert isinstance(result.analysis.causes, pl.DataFrame)


def test_cli_leaderboard(filled) -> None:
    root, _ = filled
    runner = CliRunner()
    args = ["leaderboard", "--data-dir", str(root.root), "--samples", "10"]
    out = runner.invoke(cli, [*args, "--format", "json", "--sla", "ttft_p99_s=100"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["leaderboard"][0][c.RANK] == 1
    assert body["best_under_sla"][c.MODEL] == "llama-8b"
    table = runner.invoke(cli, [*args, "--by-bucket"])
    assert table.exit_code == 0, table.output
    for bucket in ("<128", "128-512", "512-2048", "2048-8192"):
        assert bucket in table.output  # one row per prompt-length bucket
    assert "best under SLA (ttft_p99_s <= 0.5, tpot_p99_s <= 0.05): llama-8b" in table.output
    bad = runner.invoke(cli, [*args, "--sla", "ttft_p99_s"])
    assert bad.exit_code == 2


def test_cli_analyze_prints_new_incidents_once(tmp_path) -> None:
    from fleetlens.pipeline.storage import DataDir

    root = DataDir(tmp_path / "data")
    data = generate(FleetSpec(hosts=2, gpus_per_host=1, duration_s=2 * H, seed=9), [
        Injected("traffic_surge", "service_name=chat", 1.5 * H, 900)])
    write_tables(data, root)
    runner = CliRunner()
    first = runner.invoke(cli, ["analyze", "--data-dir", str(root.root)])
    assert first.exit_code == 0, first.output
    lines = [json.loads(line) for line in first.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[0]["causes"][0][c.CAUSE] == "traffic_surge"
    assert "new" in first.stderr
    again = runner.invoke(cli, ["analyze", "--data-dir", str(root.root)])
    assert not [line for line in again.stdout.splitlines() if line.startswith("{")]


def test_package_entry_point_and_grouped_baselines(filled) -> None:
    from fleetlens import analytics

    root, _ = filled
    cfg = dataclasses.replace(AnalyticsConfig(), group_by=(c.REGION,))
    result = analytics.run(root, cfg, notify=False)
    grouped = result.analysis.baselines.filter(pl.col(c.SERIES).str.contains("region="))
    assert set(grouped[c.SERIES].str.extract(r"\{(.*)\}")) == {"region=eu", "region=us"}
    # grouped series are baselined, not turned into incidents of their own: the incidents
    # are those of a run without the grouping
    plain = analytics.run(root, AnalyticsConfig(), notify=False)
    assert plain.analysis.incidents.height > 0
    assert result.analysis.incidents[c.INCIDENT_ID].to_list() == \
        plain.analysis.incidents[c.INCIDENT_ID].to_list()


def test_since_reads_relative_iso_and_unix_times_in_any_unit() -> None:
    from fleetlens.analytics.cli import parse_since

    now = 1_795_995_000 * 10**9
    ns = 1_795_995_000 * 10**9
    assert parse_since("2h", now) == now - 2 * 3600 * 10**9
    assert parse_since("2026-11-29T23:30:00Z", now) == ns
    for text in ("1795995000", "1795995000000", "1795995000000000", str(ns)):
        assert parse_since(text, now) == ns, text  # seconds, ms, µs and ns alike
