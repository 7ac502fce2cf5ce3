"""``fleetlens config check``: load, validate and print the effective configuration."""

from __future__ import annotations

import json

import click

from fleetlens.pipeline.schema.settings import ConfigError, to_dict, to_toml


@click.group()
def config() -> None:
    """Inspect the configuration (fleetlens.toml plus FLEETLENS_* overrides).

    Overrides use a double underscore between levels, e.g.
    FLEETLENS_COLLECTOR__GRPC_ADDRESS=0.0.0.0:4317; FLEETLENS_DATA sets data_dir.
    """


@config.command("check")
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["toml", "json"]), default="toml",
              show_default=True, help="How to print the effective configuration.")
def check(file: str | None, fmt: str) -> None:
    """Validate FILE (default: $FLEETLENS_CONFIG or ./fleetlens.toml if present) and print
    the effective configuration: defaults, then the file, then environment overrides.
    Secrets (auth tokens, password hashes, webhook secrets and routing keys) are printed as
    <redacted>, and webhook URLs without their path and query (a Slack webhook's path is
    its secret).

    Exits with status 1 and names the bad field when the configuration is invalid.
    """
    from fleetlens.config import load_config, resolve_config_file

    try:
        cfg = load_config(file)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None
    source = resolve_config_file(file)
    if fmt == "json":  # tokens and password hashes never reach a terminal
        click.echo(json.dumps(_redact_urls(to_dict(cfg, redact=True)), indent=2,
                              sort_keys=True))
        return
    click.echo(f"# effective configuration ({source or 'defaults'} + environment); valid")
    click.echo(to_toml(_redact_urls(to_dict(cfg, redact=True, unset=True))))


def _redact_urls(data: dict) -> dict:
    """``data`` with each [analytics] webhook URL reduced to its scheme, host and port."""
    from fleetlens.analytics.webhook_http import redact_url

    hooks = data.get("analytics", {}).get("webhooks")
    if hooks:
        data["analytics"]["webhooks"] = [
            redact_url(h) if isinstance(h, str) else {**h, "url": redact_url(h["url"])}
            for h in hooks]
    return data
