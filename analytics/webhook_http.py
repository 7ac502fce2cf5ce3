"""One webhook POST: an overall deadline, no cross-host redirects, URLs never in clear.

``urllib``'s timeout bounds each socket operation, not the post: a server that dribbles a
byte a second held a 2 s-timeout post for 36 s. :func:`post` gives the whole post (connect,
send, status line, headers, body) one deadline, enforced by a timer that shuts the socket
down, which wakes a blocked read.

Redirects: a 307/308 to the same scheme, host and port is followed (the body and signature
are re-sent; at most :data:`MAX_REDIRECTS`); any other 3xx, and every redirect to another
host, is a permanent error: the body and its signature headers must not go where the
operator did not send them.

Errors say whether a later try may succeed (:attr:`DeliveryError.retryable`): network errors,
the deadline, 408, 425, 429 and 5xx may; other 4xx and refused redirects will not. Their
messages name the webhook by :func:`redact_url` only (a Slack or PagerDuty URL is a secret).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from urllib.parse import urljoin, urlsplit

MAX_REDIRECTS = 3
#: Most of an answer's body read (for the error message); the rest is not waited for.
MAX_ANSWER_BYTES = 4096
_RETRYABLE_STATUS = frozenset({408, 425, 429})


class DeliveryError(Exception):
    """A post failed; ``retryable`` says whether trying again later may succeed."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def redact_url(url: str) -> str:
    """``url`` without user info, path, query or fragment: ``https://hooks.slack.com/…``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid URL>"
    tail = "/<redacted>" if (parts.path not in ("", "/") or parts.query or parts.fragment
                             or parts.username or parts.password) else ""
    return f"{parts.scheme}://{host}{port}{tail}"


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def post(url: str, body: bytes, headers: dict[str, str], deadline_s: float) -> int:
    """POST ``body`` to ``url`` within ``deadline_s`` seconds in all; returns the 2xx status.

    Raises:
        DeliveryError: unless a 2xx answer came in time (``retryable`` as described above).
    """
    deadline = time.monotonic() + deadline_s
    target = url
    for _ in range(MAX_REDIRECTS + 1):
        status, location = _post_once(target, body, headers, deadline, deadline_s)
        if 200 <= status < 300:
            return status
        if status in (307, 308) and location:
            nxt = urljoin(target, location)
            if _origin(nxt) != _origin(url):
                raise DeliveryError(
                    f"{status} redirect to another host ({redact_url(nxt)}) refused",
                    retryable=False)
            target = nxt
            continue
        if 300 <= status < 400:
            raise DeliveryError(f"HTTP {status}: redirects other than 307/308 to the same "
                                "host are not followed", retryable=False)
        retryable = status >= 500 or status in _RETRYABLE_STATUS
        raise DeliveryError(f"HTTP {status}", retryable=retryable)
    raise DeliveryError(f"more than {MAX_REDIRECTS} redirects", retryable=False)


def _post_once(url: str, body: bytes, headers: dict[str, str], deadline: float,
               deadline_s: float) -> tuple[int, str | None]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeliveryError("not an http(s) URL", retryable=False)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise DeliveryError(f"no answer within {deadline_s:g} s", retryable=True)
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=remaining, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=remaining)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    watchdog = threading.Timer(remaining, _hang_up, (conn,))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(MAX_ANSWER_BYTES)
        return response.status, response.getheader("Location")
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() >= deadline - 0.01:
            raise DeliveryError(f"no answer within {deadline_s:g} s", retryable=True) from None
        raise DeliveryError(f"{type(exc).__name__}: {exc}", retryable=True) from None
    finally:
        watchdog.cancel()
        conn.close()


def _hang_up(conn: http.client.HTTPConnection) -> None:
    """The deadline passed: wake the blocked read by shutting the socket down."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


__all__ = ["DeliveryError", "post", "redact_url"]
