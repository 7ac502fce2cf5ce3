"""The budgets of distinct service, host and model names a collector admits per time window
(split from :mod:`collector.decode_common`): past a budget, new names share
:data:`~collector.decode_common.OVERFLOW_NAME`, so one client cannot turn every name it
invents into a series."""

from __future__ import annotations

import threading
import time

from fleetlens.collector.decode_common import OVERFLOW_NAME


class NameLimiter:
    """Caps distinct service/host names per time window; later new names share one bucket.

    Besides the window's total, each request and each connection (gRPC peer) may add only
    so many new names per window, so one client sending thousands of names cannot fill the
    window and push the names of other clients into :data:`OVERFLOW_NAME`.
    """

    def __init__(self, max_names: int, window_s: float = 3600.0, *,
                 per_request: int | None = None, per_connection: int | None = None,
                 max_connections: int = 4096) -> None:
        self.max_names = max_names
        self.window_s = window_s
        self.per_request = per_request
        self.per_connection = per_connection
        #: Connections whose new-name counts are kept; past it the counts start over (the
        #: table stays bounded; a client opening thousands of connections still meets the
        #: per-request and window caps).
        self.max_connections = max_connections
        self._seen: set[str] = set()
        self._by_peer: dict[str, int] = {}
        self._window_start = time.monotonic()
        self._lock = threading.Lock()
        self.overflowed = 0

    def for_request(self, peer: str | None = None,
                    models: NameLimiter | None = None) -> RequestNames:
        """The names view of one request (from connection ``peer`` when known); ``models``
        caps ``gen_ai.request.model`` values apart (default: this limiter)."""
        return RequestNames(self, peer, models)

    def admit_model(self, name: str) -> str:
        """A model name against this same budget (callers without a model limiter)."""
        return self.admit(name)

    def admit(self, name: str, request: RequestNames | None = None) -> str:
        """``name`` itself, or :data:`OVERFLOW_NAME` when the window, the request's or the
        connection's budget of new names is spent."""
        if name in self._seen:
            return name
        with self._lock:
            if time.monotonic() - self._window_start > self.window_s:
                self._seen.clear()
                self._by_peer.clear()
                self._window_start = time.monotonic()
            if name in self._seen:
                return name
            if len(self._seen) < self.max_names and self._spend(request):
                self._seen.add(name)
                return name
            self.overflowed += 1
            return OVERFLOW_NAME

    def _spend(self, request: RequestNames | None) -> bool:
        """Take one new name from the request's and its connection's budgets (under lock)."""
        if request is None:
            return True
        if self.per_request is not None and request.added >= self.per_request:
            return False
        peer = request.peer
        if peer is not None and self.per_connection is not None:
            used = self._by_peer.get(peer, 0)
            if used >= self.per_connection:
                return False
            if peer not in self._by_peer and len(self._by_peer) >= self.max_connections:
                self._by_peer.clear()
            self._by_peer[peer] = used + 1
        request.added += 1
        return True


class RequestNames:
    """What decoders call ``names``: :meth:`NameLimiter.admit` with one request's budget."""

    def __init__(self, limiter: NameLimiter, peer: str | None,
                 models: NameLimiter | None = None) -> None:
        self.limiter = limiter
        self.peer = peer
        self.added = 0
        # Models have their own budget: a flood of model names must not push service and
        # host names into the overflow bucket, nor the other way round.
        self._models = RequestNames(models, peer) if models is not None else self

    def admit(self, name: str) -> str:
        """``name`` or :data:`OVERFLOW_NAME` (see :meth:`NameLimiter.admit`)."""
        return self.limiter.admit(name, self)

    def admit_model(self, name: str) -> str:
        """A ``gen_ai.request.model`` value or :data:`OVERFLOW_NAME`, on the model budget
        (issue 33: every model name ever sent became a series the exporter served)."""
        return self._models.admit(name)
