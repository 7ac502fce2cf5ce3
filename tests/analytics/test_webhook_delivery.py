"""Webhook delivery through ``fleetlens analyze`` to real receivers on 127.0.0.1: a deadline
per post, no cross-host redirects, URLs redacted, delivery state per webhook, posts made
outside the job lock."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetlens.cli import cli
from fleetlens.pipeline.joblock import lock_path
from fleetlens.pipeline.storage import DataDir
from tests.analytics.webhook_receiver import H, config_file, data_dir, fleet, serve, until


@pytest.fixture(scope="module")
def synth():  # noqa: ANN201
    return fleet()


@pytest.fixture
def root(tmp_path: Path, synth) -> DataDir:
    return data_dir(tmp_path, synth)


def analyze(root: DataDir, config: Path):  # noqa: ANN201 - click Result
    out = CliRunner().invoke(cli, ["analyze", "--data-dir", str(root.root),
                                   "--config", str(config)])
    assert out.exception is None or isinstance(out.exception, SystemExit), out.output
    return out


def ids_posted(rec) -> list[str]:  # noqa: ANN001
    return [r.json()["incident"]["incident_id"] for r in rec.posts()]


def test_a_failing_hook_does_not_repost_to_the_others(root: DataDir, tmp_path: Path) -> None:
    with serve() as good, serve(status=503) as bad:
        cfg = config_file(tmp_path, f'webhooks = ["{good.url()}", "{bad.url()}"]')
        first = analyze(root, cfg)
        assert first.exit_code == 0 and "webhook failed" in first.output, first.output
        delivered = ids_posted(good)
        assert delivered and len(bad.posts()) == 1  # a down hook costs one post per run
        analyze(root, cfg)
        assert ids_posted(good) == delivered  # not again, although `bad` still fails
        assert len(bad.posts()) == 2
        bad.status = 200
        analyze(root, cfg)
        assert ids_posted(good) == delivered
        assert ids_posted(bad)[2:] == delivered  # the down hook gets each incident once
        analyze(root, cfg)
        assert len(bad.posts()) == 2 + len(delivered) and ids_posted(good) == delivered


def test_a_dribbling_receiver_is_cut_off_at_the_deadline(root: DataDir, tmp_path: Path
                                                         ) -> None:
    with serve(dribble_s=0.25) as slow:  # a whole answer would take about 10 s
        cfg = config_file(tmp_path, f'webhooks = ["{slow.url()}"]\nwebhook_timeout_s = 1')
        out = analyze(root, cfg)
        assert "no answer within 1 s (will retry)" in out.output, out.output
        assert slow.dribbled.wait(60)
        assert slow.hung_up  # the client gave up before the answer was complete
        slow.dribble_s = None
        analyze(root, cfg)  # and the incident is still queued: delivered on the next run
        assert len(slow.posts()) == 2 and slow.posts()[0].body == slow.posts()[1].body


@pytest.mark.parametrize("status", [302, 307, 308])
def test_redirects_to_another_host_are_refused(root: DataDir, tmp_path: Path,
                                                status: int) -> None:
    with serve() as elsewhere, serve(status=status) as hook:
        # "localhost" and 127.0.0.1 are different hosts to a URL (and to a TLS certificate).
        hook.location = elsewhere.url("/stolen", host="localhost")
        cfg = config_file(tmp_path, f'webhooks = ["{hook.url()}"]')
        out = analyze(root, cfg)
        assert elsewhere.received == [], [(r.method, r.path) for r in elsewhere.received]
        if status == 302:
            assert "HTTP 302: redirects other than 307/308" in out.output, out.output
        else:
            assert "redirect to another host (http://localhost:" in out.output, out.output
        assert "not retried" in out.output
        analyze(root, cfg)  # permanent: not posted again
        assert len(hook.posts()) == 1


def test_same_host_307_is_followed_with_the_body(root: DataDir, tmp_path: Path) -> None:
    with serve(status=307, redirect_from="/hook") as hook:
        hook.location = "/moved"  # relative, same host and port
        out = analyze(root, config_file(tmp_path, f'webhooks = ["{hook.url()}"]'))
        assert "webhook failed" not in out.output, out.output
        assert [r.path for r in hook.posts()] == ["/hook", "/moved"]
        assert hook.posts()[0].body == hook.posts()[1].body


def test_urls_are_redacted_in_errors(root: DataDir, tmp_path: Path) -> None:
    with serve(status=500) as hook:
        url = hook.url("/services/T000/B000/S3cr3tPathPart?token=abc")
        cfg = config_file(tmp_path, f'webhooks = ["{url}"]')
        out = analyze(root, cfg)
        assert f"http://127.0.0.1:{hook.port}/<redacted> (native): HTTP 500" in out.output
        assert "S3cr3tPathPart" not in out.output and "token=abc" not in out.output


def test_posts_are_made_outside_the_job_lock(root: DataDir, tmp_path: Path) -> None:
    def lock_is_free() -> bool:
        fd = os.open(lock_path(root), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing the descriptor releases a lock taken on it
        return True

    with serve() as hook:
        hook.during = lock_is_free
        analyze(root, config_file(tmp_path, f'webhooks = ["{hook.url()}"]'))
        assert hook.during_results and all(hook.during_results)


def test_config_check_redacts_webhook_urls_and_secrets(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, (
        'webhooks = ["https://hooks.slack.com/services/T0/B0/SLACKSECRET",\n'
        '  {url = "https://hooks.example.com/x?key=QUERYSECRET", secret = "HMACSECRET-0123456"},'
        '\n  {url = "https://events.pagerduty.com/v2/enqueue", format = "pagerduty",'
        ' routing_key = "ROUTINGSECRET"}]'))
    for fmt in ("toml", "json"):
        out = CliRunner().invoke(cli, ["config", "check", str(cfg), "--format", fmt])
        assert out.exit_code == 0, out.output
        for secret in ("SLACKSECRET", "QUERYSECRET", "HMACSECRET", "ROUTINGSECRET"):
            assert secret not in out.output, (fmt, out.output)
        assert "https://hooks.slack.com/<redacted>" in out.output
        assert "pagerduty" in out.output
    again = tmp_path / "again.toml"
    again.write_text(CliRunner().invoke(cli, ["config", "check", str(cfg)]).output)
    reread = CliRunner().invoke(cli, ["config", "check", str(again), "--format", "json"])
    assert reread.exit_code == 0, reread.output  # what config check prints still loads
    assert len(json.loads(reread.output)["analytics"]["webhooks"]) == 3


def test_bad_webhook_config_names_the_field_without_the_url(tmp_path: Path) -> None:
    cases = [('webhooks = ["ftp://x/SECRETPATH"]', "analytics.webhooks[0].url"),
             ('webhooks = [{url = "http://x", format = "teams"}]', "analytics.webhooks[0].format"),
             ('webhooks = [{url = "http://x", format = "pagerduty"}]', "routing_key")]
    for text, field in cases:
        out = CliRunner().invoke(cli, ["config", "check", str(config_file(tmp_path, text))])
        assert out.exit_code == 1 and field in out.output, out.output
        assert "SECRETPATH" not in out.output


def test_an_ongoing_incident_is_not_resolved(tmp_path: Path, synth) -> None:
    # (the resolve path itself is covered per format in test_webhook_formats.py)
    root = data_dir(tmp_path, until(synth, 2 * H + 600))
    with serve() as hook:
        cfg = config_file(tmp_path, (
            f'webhooks = [{{url = "{hook.url()}", format = "pagerduty", '
            'routing_key = "R0123456789abcdef"}]'))
        analyze(root, cfg)
        analyze(root, cfg)
        actions = [r.json()["event_action"] for r in hook.posts()]
        assert actions == ["trigger"]


@pytest.mark.parametrize("status,retried", [(400, False), (404, False), (429, True),
                                            (408, True), (502, True)])
def test_permanent_errors_are_not_retried(root: DataDir, tmp_path: Path, status: int,
                                          retried: bool) -> None:
    with serve(status=status) as hook:
        cfg = config_file(tmp_path, f'webhooks = ["{hook.url()}"]')
        out = analyze(root, cfg)
        assert f"HTTP {status}" in out.output
        assert ("(will retry)" in out.output) is retried
        assert ("not retried" in out.output) is not retried
        analyze(root, cfg)
        assert len(hook.posts()) == (2 if retried else 1)


def test_incidents_notified_before_the_upgrade_are_not_posted_again(root: DataDir,
                                                                    tmp_path: Path) -> None:
    with serve() as hook:
        analyze(root, config_file(tmp_path, ""))  # no webhooks yet: finds the incident
        ids = json.loads((root.state / "analytics" / "deliveries.json").read_text())["seen"]
        assert ids
        # a data dir as the previous release left it: notified.json only
        (root.state / "analytics" / "deliveries.json").unlink()
        (root.state / "analytics" / "notified.json").write_text(json.dumps(ids))
        analyze(root, config_file(tmp_path, f'webhooks = ["{hook.url()}"]'))
        assert hook.posts() == []
