"""Dashboard configuration (the ``[dashboard]`` table of ``fleetlens.toml``).

Security defaults are closed: the dashboard binds 127.0.0.1, and binding any other address
requires a login (``auth = "password"`` or ``auth = "oidc"``) unless the operator opts out
explicitly with ``allow_unauthenticated = true`` (e.g. behind an authenticating proxy).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fleetlens.pipeline.schema.settings import is_loopback as settings_is_loopback
from fleetlens.pipeline.schema.settings import load_section, require

LOOPBACK = "127.0.0.1"
AUTH_MODES = ("none", "password", "oidc")
#: Environment variable holding the dashboard password (never put it in the config file).
ENV_PASSWORD = "FLEETLENS_DASHBOARD_PASSWORD"


@dataclass(frozen=True)
class DashboardConfig:
    """Where the dashboard listens, who may see it and how much the SQL console returns."""

    address: str = LOOPBACK
    port: int = 8501
    #: ``none`` (loopback only), ``password`` (shared password, scrypt hash below or the
    #: FLEETLENS_DASHBOARD_PASSWORD variable) or ``oidc`` (Streamlit native auth: configure
    #: the ``[auth]`` section of ``.streamlit/secrets.toml``).
    auth: str = "none"
    #: ``scrypt$<salt hex>$<hash hex>`` as printed by ``fleetlens dashboard --hash-password``.
    password_hash: str | None = None
    #: Serve without login on a non-loopback address (only behind an authenticating proxy).
    allow_unauthenticated: bool = False
    #: auth = "oidc": who may see the dashboard once the provider signed them in (any match
    #: lets in): exact e-mail addresses and e-mail domains (both only with the provider's
    #: ``email_verified`` = true) and groups (the ``groups`` claim). One is required: a public
    #: provider (Google, Microsoft "common") signs in anyone (issue 33).
    oidc_allowed_emails: tuple[str, ...] = ()
    oidc_allowed_domains: tuple[str, ...] = ()
    oidc_allowed_groups: tuple[str, ...] = ()
    #: Most rows the SQL console returns.
    sql_row_cap: int = 1000
    #: Seconds a loaded frame is reused before it is read again from the data directory.
    cache_ttl_s: int = 30
    #: Auto-refresh interval offered in the sidebar (0 hides the option).
    auto_refresh_s: int = 30

    def validate(self) -> None:
        require(0 < self.port < 65536, "port", f"expected 1..65535, got {self.port}")
        require(bool(self.address), "address", "must not be empty")
        require(self.auth in AUTH_MODES, "auth", f"expected one of {AUTH_MODES}")
        require(
            self.auth == "none" or self.allow_unauthenticated is False,
            "allow_unauthenticated", "only applies with auth = \"none\"",
        )
        require(
            self.auth != "none" or is_loopback(self.address) or self.allow_unauthenticated,
            "auth", f"address {self.address} is not loopback: set auth to \"password\" or "
            "\"oidc\" (or allow_unauthenticated = true behind an authenticating proxy)",
        )
        require(
            self.auth != "oidc" or bool(self.oidc_allowed_emails or self.oidc_allowed_domains
                                        or self.oidc_allowed_groups),
            "oidc_allowed_emails", "auth = \"oidc\" needs oidc_allowed_emails, "
            "oidc_allowed_domains or oidc_allowed_groups: the provider signs in accounts, it "
            "does not say which may see this dashboard",
        )
        require(
            self.password_hash is None or self.password_hash.startswith("scrypt$"),
            "password_hash", "expected scrypt$<salt>$<hash> (fleetlens dashboard --hash-password)",
        )
        require(0 < self.sql_row_cap <= 1_000_000, "sql_row_cap", "expected 1..1000000")
        require(self.cache_ttl_s >= 0, "cache_ttl_s", "must not be negative")
        require(self.auto_refresh_s >= 0, "auto_refresh_s", "must not be negative")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP, ``localhost`` or a name) only accepts connections from this
    host (the one check in :mod:`pipeline.schema.settings`, names resolved as Streamlit will)."""
    return settings_is_loopback(address, resolve=True)


def load_dashboard_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> DashboardConfig:
    """The ``[dashboard]`` section: defaults, then the config file, then ``FLEETLENS_*``.

    The file is ``path``, else ``$FLEETLENS_CONFIG``, else ``./fleetlens.toml`` when present
    (the same resolution as :func:`fleetlens.config.load_config`, which the dashboard may not
    import).
    """
    return load_section(DashboardConfig, "dashboard", path, environ=environ)
