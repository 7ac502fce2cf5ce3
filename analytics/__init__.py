"""Baselines, incident detection, root-cause attribution, KV-cache, energy and leaderboard.

``analytics.run(data_dir, config)`` is the entry point for the CLI, the demo and follow
loops: one analysis pass over a data directory (see :mod:`analytics.runner`).
"""

from __future__ import annotations

from typing import Any


def run(data_dir: Any, config: Any = None, **kwargs: Any) -> Any:
    """Analyse ``data_dir`` and publish baselines, incidents and causes; see
    :func:`analytics.runner.run` (imported lazily so ``import analytics`` stays cheap)."""
    from fleetlens.analytics.runner import run as _run

    return _run(data_dir, config, **kwargs)


__all__ = ["run"]
