"""A small OpenID Connect provider on 127.0.0.1 for the dashboard's login test.

Real HTTP, real RS256 signatures: discovery document, an authorization endpoint with a
sign-in form, a token endpoint (client_secret_basic, PKCE S256 checked, one use per code)
that returns a signed ``id_token`` with the caller's nonce, a JWKS and userinfo. One user,
whatever name is typed into the form.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from joserfc import jwt
from joserfc.jwk import RSAKey


class Provider:
    """The provider's state: its key, its one client and the codes it handed out."""

    def __init__(self, client_id: str, client_secret: str) -> None:
        self.client_id, self.client_secret = client_id, client_secret
        self.key = RSAKey.generate_key(2048, parameters={"kid": "test-key", "use": "sig"})
        self.codes: dict[str, dict[str, Any]] = {}
        self.tokens_issued = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def metadata_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def __enter__(self) -> Provider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def discovery(self) -> dict[str, Any]:
        return {"issuer": self.issuer, "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token", "jwks_uri": f"{self.issuer}/jwks",
                "userinfo_endpoint": f"{self.issuer}/userinfo",
                "response_types_supported": ["code"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                "scopes_supported": ["openid", "email", "profile"]}

    def id_token(self, grant: dict[str, Any]) -> str:
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": grant["user"], "aud": self.client_id,
                  "iat": now, "exp": now + 600, "nonce": grant["nonce"],
                  "email": f"{grant['user']}@example.test", "email_verified": True,
                  "name": grant["user"]}
        header = {"alg": "RS256", "kid": "test-key"}
        return jwt.encode(header, claims, self.key)

    def exchange(self, form: dict[str, str], authorization: str) -> tuple[int, dict[str, Any]]:
        """The token endpoint: (HTTP status, JSON body)."""
        expected = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        if authorization != f"Basic {expected}":
            return 401, {"error": "invalid_client"}
        grant = self.codes.pop(form.get("code", ""), None)  # a code is good once
        if grant is None or form.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant"}
        if grant.get("challenge"):
            digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
            if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["challenge"]:
                return 400, {"error": "invalid_grant", "error_description": "PKCE"}
        self.tokens_issued += 1
        return 200, {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer",
                     "expires_in": 600, "id_token": self.id_token(grant),
                     "scope": "openid email profile"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet test output
                pass

            def _send(self, status: int, body: bytes, kind: str,
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, body: dict[str, Any]) -> None:
                self._send(status, json.dumps(body).encode(), "application/json")

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                if url.path == "/.well-known/openid-configuration":
                    self._json(200, provider.discovery())
                elif url.path == "/jwks":
                    self._json(200, {"keys": [provider.key.as_dict(private=False)]})
                elif url.path == "/authorize":
                    if query.get("client_id") != provider.client_id:
                        self._json(400, {"error": "unauthorized_client"})
                        return
                    hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" '
                                     f'value="{html.escape(v)}">' for k, v in query.items())
                    page = (f"<html><body><h1>Test OIDC provider</h1><form method='post' "
                            f"action='/authorize'>{hidden}<label>User <input name='user' "
                            "value='oncall'></label><button type='submit'>Sign in</button>"
                            "</form></body></html>")
                    self._send(200, page.encode(), "text/html")
                elif url.path == "/userinfo":
                    self._json(200, {"sub": "oncall", "email": "oncall@example.test"})
                else:
                    self._json(404, {"error": "not_found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                if self.path == "/authorize":
                    code = secrets.token_urlsafe(16)
                    provider.codes[code] = {
                        "user": form.get("user", "oncall"), "nonce": form.get("nonce"),
                        "redirect_uri": form["redirect_uri"],
                        "challenge": form.get("code_challenge")}
                    target = form["redirect_uri"] + "?" + urllib.parse.urlencode(
                        {"code": code, "state": form.get("state", "")})
                    self._send(302, b"", "text/plain", {"Location": target})
                elif self.path == "/token":
                    status, body = provider.exchange(form, self.headers.get("Authorization", ""))
                    self._json(status, body)
                else:
                    self._json(404, {"error": "not_found"})

        return Handler
