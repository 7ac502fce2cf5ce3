"""``fleetlens config check``: load, validate and print the effective configuration."""

from __future__ import annotations

import json
import re

import click

from fleetlens.pipeline.schema.settings import ConfigError, to_dict


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
    click.echo(_to_toml(_redact_urls(to_dict(cfg, redact=True, unset=True))))


def _redact_urls(data: dict) -> dict:
    """``data`` with each [analytics] webhook URL reduced to its scheme, host and port."""
    from fleetlens.analytics.webhook_http import redact_url

    hooks = data.get("analytics", {}).get("webhooks")
    if hooks:
        data["analytics"]["webhooks"] = [
            redact_url(h) if isinstance(h, str) else {**h, "url": redact_url(h["url"])}
            for h in hooks]
    return data


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(name: str) -> str:
    """A TOML key: bare when it may be (``grpc_address``), quoted otherwise (a GPU model)."""
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def _to_toml(data: dict, prefix: str = "") -> str:
    """``data`` as TOML that ``config check`` reads back; unset fields as comments."""
    scalars = [f"# {_key(k)} = (unset)" if v is None else f"{_key(k)} = {_toml_value(v)}"
               for k, v in data.items() if not isinstance(v, dict)]
    lines = [f"[{prefix}]"] if prefix and (scalars or not data) else []
    lines += scalars or (["# (empty)"] if prefix and not data else [])
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", _to_toml(value, f"{prefix}.{_key(key)}" if prefix else _key(key))]
    return "\n".join(lines).strip("\n")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # a table inside a list ([[agent.vllm]]): an inline table
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    return json.dumps(str(value))
