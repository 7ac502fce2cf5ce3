"""Issue 33 item 10: an ``http://`` S3 endpoint turned plain HTTP on for any host, silently.
Now loopback stays allowed, another host needs ``AWS_ALLOW_HTTP=true`` and is warned about."""

from __future__ import annotations

import logging
import secrets

import pytest

from fleetlens.pipeline.storage import DataDir, StorageError, resolve_s3_settings

BASE = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_CONFIG_FILE": "/dev/null"}


@pytest.mark.parametrize("endpoint", ["http://minio.minio.svc:9000", "http://10.0.0.7:9000",
                                      "HTTP://[2001:db8::1]:9000"])
def test_plain_http_to_another_host_is_refused_without_the_switch(endpoint: str) -> None:
    with pytest.raises(ValueError, match="AWS_ALLOW_HTTP=true"):
        resolve_s3_settings("b", {**BASE, "AWS_ENDPOINT_URL": endpoint})


def test_the_switch_allows_it_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"http://minio-{secrets.token_hex(3)}.internal:9000"
    with caplog.at_level(logging.WARNING, logger="fleetlens.storage"):
        settings = resolve_s3_settings(
            "b", {**BASE, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_ALLOW_HTTP": "true"})
    assert settings.allow_http and settings.endpoint == endpoint
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "plain HTTP" in caplog.text and endpoint in caplog.text


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", "http://localhost:9000",
                                      "http://[::1]:9000", "https://s3.example.com"])
def test_loopback_and_https_need_nothing(endpoint: str, caplog: pytest.LogCaptureFixture
                                         ) -> None:
    with caplog.at_level(logging.WARNING, logger="fleetlens.storage"):
        settings = resolve_s3_settings("b", {**BASE, "AWS_ENDPOINT_URL": endpoint})
    assert settings.endpoint == endpoint and not caplog.records


def test_a_data_dir_on_a_plaintext_remote_endpoint_is_one_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in BASE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.minio.svc:9000")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    with pytest.raises(StorageError, match="plain HTTP to minio.minio.svc") as info:
        DataDir(f"s3://plain-{secrets.token_hex(4)}/fleet")
    assert "\n" not in str(info.value)
