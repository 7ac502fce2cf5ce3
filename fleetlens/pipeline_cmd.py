"""``fleetlens pipeline``: the pipeline command with analytics run after each live run
(on the same Ray cluster with ``--runner ray``).

The pipeline package may not import analytics (imports flow one way), so the command line,
which may import everything, hands the pipeline's follow loop a hook that runs detection
and posts new incidents (webhooks and stdout as JSON lines).
"""

from __future__ import annotations

import sys

import click

from fleetlens.pipeline.cli import make_pipeline_command
from fleetlens.pipeline.runner import RunSummary
from fleetlens.pipeline.storage import DataDir


def analyze_after_run(root: DataDir, config_file: str | None, summary: RunSummary) -> None:
    """Run analytics over ``root`` and report new incidents (called after a pipeline run)."""
    from fleetlens.analytics.cli import load_analytics_config
    from fleetlens.analytics.runner import run

    result = run(root, load_analytics_config(config_file), echo=click.echo,
                 remote=_ray_if_connected())
    for error in result.post_errors:
        click.echo(f"webhook failed: {error}", err=True)
    click.echo(f"analytics: {result.analysis.incidents.height} incidents "
               f"({len(result.new_incidents)} new) in {result.seconds:.2f} s", err=True)


def _ray_if_connected():  # noqa: ANN202 - RayAnalytics or None
    """Analytics on the Ray cluster the pipeline ran on (``--runner ray``), else here. Looks
    only at modules already loaded: the local runner never imports Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from fleetlens.analytics.ray_tasks import RayAnalytics

    return RayAnalytics()


pipeline = make_pipeline_command(after_run=analyze_after_run)
