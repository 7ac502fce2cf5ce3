"""Where an ``s3://`` data directory is and how to sign requests to it."""

from __future__ import annotations

import configparser
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # DuckDB and Polars only for readers: the collector never loads them (RSS)
    pass
from fleetlens.pipeline.storage.base import URL_SCHEME

# -- S3 settings -----------------------------------------------------------------------

# Where an ``s3://`` data directory is and how to sign requests to it.
#
# Resolved the way the AWS tools do, so an operator configures fleetlens like the ``aws`` CLI:
# the environment first (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
# ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` for MinIO and
# other S3-compatible servers), then the shared files (``AWS_SHARED_CREDENTIALS_FILE``, default
# ``~/.aws/credentials``, and ``AWS_CONFIG_FILE``, default ``~/.aws/config``) for the profile
# ``AWS_PROFILE`` (default ``default``). Nothing here talks to the network.
#
# One resolved :class:`S3Settings` feeds all three clients that touch the store, so they cannot
# disagree: obstore (listing, publishing, state and lease objects), Polars (``storage_options``)
# and, for DuckDB only, an s3fs filesystem registered with the connection. :func:`export` also
# puts what came from the files into this process's environment (never over a variable that is
# set), for the few Polars reads that take plain ``s3://`` strings from ``parquet_files``.

DEFAULT_REGION = "us-east-1"
#: object_store's own switch for plain HTTP; here it must be set to reach a non-loopback host.
ENV_ALLOW_HTTP = "AWS_ALLOW_HTTP"
log = logging.getLogger("fleetlens.storage")
_WARNED: set[str] = set()


@dataclass(frozen=True)
class S3Settings:
    """Endpoint, region and credentials of one bucket (None: let the client find them)."""

    bucket: str
    region: str
    endpoint: str | None = None
    key_id: str | None = None
    secret: str | None = None
    token: str | None = None

    @property
    def allow_http(self) -> bool:
        """Plain HTTP only when the endpoint says so (a local MinIO or test server)."""
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def obstore_config(self) -> dict[str, object]:
        """Keyword arguments of ``obstore.store.S3Store``."""
        out: dict[str, object] = {"region": self.region}
        if self.endpoint:
            out["endpoint"] = self.endpoint
            # MinIO and moto serve path-style URLs; virtual-hosted names need DNS.
            out["virtual_hosted_style_request"] = False
        if self.allow_http:
            out["client_options"] = {"allow_http": True}
        if self.key_id and self.secret:
            out["access_key_id"] = self.key_id
            out["secret_access_key"] = self.secret
            if self.token:
                out["session_token"] = self.token
        return out

    def polars_options(self) -> dict[str, str]:
        """``storage_options`` for Polars' native object-store reader."""
        out = {"aws_region": self.region}
        if self.endpoint:
            out["aws_endpoint_url"] = self.endpoint
            out["aws_virtual_hosted_style_request"] = "false"
        if self.allow_http:
            out["aws_allow_http"] = "true"
        if self.key_id and self.secret:
            out["aws_access_key_id"] = self.key_id
            out["aws_secret_access_key"] = self.secret
            if self.token:
                out["aws_session_token"] = self.token
        return out

    def s3fs_options(self) -> dict[str, object]:
        """Keyword arguments of ``s3fs.S3FileSystem`` (DuckDB's registered filesystem)."""
        out: dict[str, object] = {
            "client_kwargs": {"region_name": self.region},
            # Readers must see objects published after they connected: no listing cache.
            "use_listings_cache": False, "skip_instance_cache": True,
        }
        if self.endpoint:
            out["endpoint_url"] = self.endpoint
        if self.key_id and self.secret:
            out.update(key=self.key_id, secret=self.secret, token=self.token)
        return out


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``.

    Raises:
        ValueError: not an ``s3://`` URL with a bucket name, or a ``.``/``..`` component.
    """
    if not url.startswith(URL_SCHEME):
        raise ValueError(f"{url!r} is not an {URL_SCHEME} URL")
    bucket, _, prefix = url[len(URL_SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (expected s3://BUCKET[/PREFIX])")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"{url!r}: '.' and '..' are not allowed in an object prefix")
    return bucket, "/".join(parts)


def _profile_section(path: Path, section: str) -> dict[str, str]:
    if not path.is_file():
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error:
        return {}  # a damaged AWS file: the environment may still be enough
    return dict(parser[section]) if parser.has_section(section) else {}


def resolve_s3_settings(bucket: str, env: dict[str, str] | None = None) -> S3Settings:
    """The settings of ``bucket`` from the environment and the AWS shared files.

    Raises:
        ValueError: an ``http://`` endpoint on a non-loopback host without
            ``AWS_ALLOW_HTTP=true`` (see :func:`_check_plaintext`).
    """
    env = dict(os.environ if env is None else env)
    profile = env.get("AWS_PROFILE") or "default"
    home = Path(env.get("HOME") or Path.home())
    creds = _profile_section(
        Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"), profile)
    conf = _profile_section(Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config"),
                            profile if profile == "default" else f"profile {profile}")
    key_id, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    token = env.get("AWS_SESSION_TOKEN")
    if not (key_id and secret):
        key_id, secret = creds.get("aws_access_key_id"), creds.get("aws_secret_access_key")
        token = creds.get("aws_session_token")
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or conf.get("region")
              or DEFAULT_REGION)
    endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
                or conf.get("endpoint_url"))
    if endpoint:
        _check_plaintext(endpoint, env)
    return S3Settings(bucket, region, endpoint or None, key_id or None, secret or None,
                      token or None)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_plaintext(endpoint: str, env: dict[str, str]) -> None:
    """Refuse an ``http://`` endpoint on another host unless ``AWS_ALLOW_HTTP=true`` says so.

    Plain HTTP used to follow from the URL alone, for any host and silently (issue 33): every
    object, raw telemetry included, then crosses the network readable and alterable. On
    loopback (a local MinIO, a test server) it stays allowed without a word; elsewhere it
    takes the explicit switch, and is then logged once as a warning.

    Raises:
        ValueError: a plaintext endpoint on another host without the switch.
    """
    if not endpoint.lower().startswith("http://"):
        return
    host = urlsplit(endpoint).hostname or ""
    if _is_loopback(host):
        return
    if env.get(ENV_ALLOW_HTTP, "").strip().lower() not in ("true", "1", "yes"):
        raise ValueError(
            f"the S3 endpoint {endpoint} is plain HTTP to {host}: objects would cross the "
            f"network unencrypted; use https://, or set {ENV_ALLOW_HTTP}=true to allow it on "
            "a network you trust")
    if endpoint not in _WARNED:
        _WARNED.add(endpoint)
        log.warning("S3 endpoint %s is plain HTTP (%s=true): objects cross the network "
                    "unencrypted", endpoint, ENV_ALLOW_HTTP)


def export_s3_settings(settings: S3Settings, env: dict[str, str] | None = None) -> None:
    """Set the standard AWS variables of ``settings`` that the environment lacks."""
    target = os.environ if env is None else env
    wanted = {"AWS_REGION": settings.region, "AWS_ENDPOINT_URL": settings.endpoint,
              "AWS_ALLOW_HTTP": "true" if settings.allow_http else None,
              "AWS_ACCESS_KEY_ID": settings.key_id, "AWS_SECRET_ACCESS_KEY": settings.secret,
              "AWS_SESSION_TOKEN": settings.token}
    if target.get("AWS_ACCESS_KEY_ID"):  # never mix a key id from one place, a secret from another
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            wanted.pop(key)
    for key, value in wanted.items():
        if value and not target.get(key):
            target[key] = value
