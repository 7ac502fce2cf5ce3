"""One logging set-up for every long-running fleetlens process (collector and its workers,
agent, pipeline, exporter): the level and the format come from ``fleetlens --log-level`` and
``--log-format`` (which set ``$FLEETLENS_LOG_LEVEL`` and ``$FLEETLENS_LOG_FORMAT``, so forked
workers and child processes inherit them), else the caller's default.

``json`` writes one object per line (``ts``, ``level``, ``logger``, ``msg``, plus ``process``
when given, and ``exc`` with a traceback), for log shippers that parse JSON; ``text`` is the
human format. Lives in ``pipeline.schema`` because every component may import it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os

LEVEL_ENV = "FLEETLENS_LOG_LEVEL"
FORMAT_ENV = "FLEETLENS_LOG_FORMAT"
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record; control characters in messages are escaped by JSON."""

    def __init__(self, process_tag: str = "") -> None:
        super().__init__()
        self.process_tag = process_tag

    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.process_tag:
            body["process"] = self.process_tag
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


def configure_logging(default_level: int = logging.INFO, *, process_tag: str = "") -> None:
    """Configure the root logger from the environment (see the module docstring).

    ``process_tag`` (e.g. ``worker1``) goes in every line, so the lines of forked workers can
    be told apart. Replaces handlers set up before (a forked worker inherits its parent's).
    """
    name = os.environ.get(LEVEL_ENV, "").strip().lower()
    level = getattr(logging, name.upper()) if name in LEVELS else default_level
    handler = logging.StreamHandler()
    if os.environ.get(FORMAT_ENV, "").strip().lower() == "json":
        handler.setFormatter(JsonFormatter(process_tag))
    else:
        tag = f"{process_tag} " if process_tag else ""
        handler.setFormatter(logging.Formatter(f"%(asctime)s {tag}%(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
