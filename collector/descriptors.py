"""File descriptors: the one resource every part of a worker draws from.

A worker's connections (OTLP/gRPC, OTLP/HTTP, self-metrics scrapes), its WAL, its Parquet
publishing and its ``/proc`` reads share one ``RLIMIT_NOFILE``. Issue 33 saw 1,050 trickling
scrape connections take all 1,024 and then OTLP Exports and the Parquet flush failed. So:

- at start the soft limit is raised to the hard limit (the default soft 1,024 is a relic of
  ``select()``; nothing here uses ``select`` on more than one socket);
- :data:`RESERVED_FDS` stay for the WAL, publishing, cursors and ``/proc``;
- self-metrics scrapes have a fixed number of slots (:mod:`~fleetlens.collector.self_metrics`),
  and so do the sockets between workers that balance Exports (:mod:`~fleetlens.collector.balance`);
- OTLP/HTTP connections (open, being refused, lingering) take at most half of what is
  left, so gRPC connections, which grpcio gives no way to cap, keep the other half.
"""

from __future__ import annotations

import resource

from fleetlens.collector.telemetry import log

#: Descriptors no connection may take: WAL files and their directory, Parquet being written
#: and published, forwarding cursors, ``/proc`` reads, gRPC's own pipes and epoll.
RESERVED_FDS = 64
#: Linux refuses a soft limit above ``fs.nr_open``; an "unlimited" hard limit is read as this.
_UNLIMITED_AS = 1 << 20


def raise_open_files_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_AS if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("open files limit raised from %d to %d (the hard limit)", soft, target)
            soft = target
        except (ValueError, OSError) as exc:  # e.g. above fs.nr_open
            log.warning("open files limit stays %d: cannot raise it to %d (%s)", soft, target,
                        exc)
    return _UNLIMITED_AS if soft == resource.RLIM_INFINITY else soft


def open_files_limit() -> int:
    """This process's soft ``RLIMIT_NOFILE``."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _UNLIMITED_AS if soft == resource.RLIM_INFINITY else soft


def http_connection_cap(configured: int, limit: int, kept: int) -> int:
    """OTLP/HTTP connections (refusals included) one worker may hold under ``limit``.

    Half of what the reserve and ``kept`` (self-metrics scrape slots, sockets between
    workers) leave, never more than ``configured``
    (``http_max_connections`` plus its refusal slots), never less than 1; logged when the
    limit, not the setting, decides.
    """
    share = max(1, (limit - RESERVED_FDS - kept) // 2)
    if share < configured:
        log.warning("only %d file descriptors (RLIMIT_NOFILE): OTLP/HTTP connections capped "
                    "at %d per worker instead of %d, to keep descriptors for gRPC, the WAL "
                    "and publishing; raise the hard limit (ulimit -Hn) to lift this",
                    limit, share, configured)
    return min(configured, share)
