"""Loading frozen config dataclasses from ``fleetlens.toml`` and ``FLEETLENS_*`` variables.

Each component owns one frozen dataclass tree (``collector.config``, ``pipeline.config``, ...).
This module is the shared machinery: it turns a TOML table into such a tree, rejecting unknown
keys and wrong types with the dotted path of the field, and applies environment overrides.

Environment overrides use a double underscore between levels and are parsed as TOML values
when they parse, else taken as strings::

    FLEETLENS_COLLECTOR__GRPC_ADDRESS=0.0.0.0:4317
    FLEETLENS_COLLECTOR__AUTH_TOKENS='["s3cret"]'

``FLEETLENS_DATA`` sets the top-level ``data_dir``.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ENV_PREFIX = "FLEETLENS_"
ENV_SEPARATOR = "__"
ENV_DATA_DIR = "FLEETLENS_DATA"
ENV_CONFIG_FILE = "FLEETLENS_CONFIG"
DEFAULT_CONFIG_FILE = "fleetlens.toml"
DEFAULT_DATA_DIR = "./fleetlens-data"
#: Help text of every command's ``--data-dir`` (the order :meth:`DataDir.from_env` uses).
DATA_DIR_HELP = ("Data directory [default: $FLEETLENS_DATA, else the config file's data_dir, "
                 "else ./fleetlens-data].")


class ConfigError(ValueError):
    """A config file or override is invalid; the message starts with the field's dotted path."""


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a syntax error becomes a :class:`ConfigError` naming the file."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:  # a directory, no permission: still the user's file to fix
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Collect ``FLEETLENS_*`` variables into a nested dict of overrides."""
    environ = os.environ if environ is None else environ
    result: dict[str, Any] = {}
    for name, raw in environ.items():
        if name == ENV_DATA_DIR:
            result["data_dir"] = raw
            continue
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name or name == ENV_CONFIG_FILE:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split(ENV_SEPARATOR)]
        node = result
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _parse_env_value(raw)
    return result


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base``."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def build(cls: type[T], data: Mapping[str, Any], path: str = "") -> T:
    """Build the frozen dataclass ``cls`` from ``data``, checking keys and types.

    Args:
        cls: a dataclass whose fields all have defaults.
        data: the TOML table for it.
        path: the dotted path of ``data`` in the file, for error messages.

    Raises:
        ConfigError: on an unknown key (with a suggestion) or a value of the wrong type.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or '<root>'}: expected a table, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else key
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key{hint} (known: {', '.join(fields)})")
        kwargs[key] = _coerce(hints[key], value, where)
    config = cls(**kwargs)
    validate_tree(config, path)
    return config


def validate_tree(config: Any, path: str = "") -> None:
    """Call ``validate()`` on ``config`` and every nested dataclass, prefixing errors with paths."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            validate_tree(value, f"{path}.{field.name}" if path else field.name)
    check = getattr(config, "validate", None)
    if check is None:
        return
    try:
        check()
    except ConfigError as exc:
        raise ConfigError(f"{path}.{exc}" if path else str(exc)) from None


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        candidates = [a for a in args if a is not type(None)]
        if isinstance(value, Mapping):  # a table: its dataclass's error names the bad key
            candidates.sort(key=lambda a: not dataclasses.is_dataclass(a))
        for arg in candidates:
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        item = args[0] if args else Any
        return tuple(_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {type(value).__name__}")
        return dict(value)
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if hint is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if isinstance(hint, type) and not isinstance(value, hint):
        got = f"{type(value).__name__} {value!r}"
        raise ConfigError(f"{where}: expected {hint.__name__}, got {got}")
    return value


#: Config fields whose values are secrets: printed as :data:`REDACTED`, never in clear.
SECRET_FIELDS = frozenset({"auth_tokens", "auth_token", "password_hash", "secret",
                           "routing_key"})
REDACTED = "<redacted>"


def config_file(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The config file to read: ``path``, else ``$FLEETLENS_CONFIG``, else
    ``./fleetlens.toml`` if it exists, else ``None`` (defaults only)."""
    environ = os.environ if environ is None else environ
    if path:
        return Path(path)
    if environ.get(ENV_CONFIG_FILE):
        return Path(environ[ENV_CONFIG_FILE])
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.exists() else None


def read_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The whole config tree as data: the file (see :func:`config_file`), then
    ``FLEETLENS_*`` environment overrides."""
    file = config_file(path, environ)
    return merge(read_toml(file) if file else {}, env_overrides(environ))


def load_section(
    cls: type[T],
    section: str,
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """One component's config: defaults, the file's ``[section]``, ``FLEETLENS_SECTION__*``
    variables, then ``overrides`` (command-line options; ``None`` values are ignored).

    Raises:
        ConfigError: naming the bad field (``section.field``).
    """
    data = read_config(path, environ).get(section, {})
    if not isinstance(data, Mapping):
        raise ConfigError(f"{section}: expected a table, got {type(data).__name__}")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    return build(cls, merge(dict(data), given), section)


def to_dict(config: Any, *, redact: bool = False, unset: bool = False) -> dict[str, Any]:
    """The config as plain TOML-able data (tuples become lists, ``None`` fields are dropped).

    Args:
        config: a config dataclass.
        redact: replace the values of :data:`SECRET_FIELDS` (for printing and logging).
        unset: keep ``None`` fields as ``None`` (to show every key that exists).
    """
    out: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if redact and field.name in SECRET_FIELDS and value:
            out[field.name] = [REDACTED] * len(value) if isinstance(value, tuple) else REDACTED
        elif dataclasses.is_dataclass(value):
            out[field.name] = to_dict(value, redact=redact, unset=unset)
        elif isinstance(value, tuple):  # a list of tables ([[agent.vllm]]) stays tables
            out[field.name] = [
                to_dict(v, redact=redact) if dataclasses.is_dataclass(v) else v for v in value
            ]
        elif value is not None or unset:
            out[field.name] = value
    return out


def require(condition: bool, field: str, message: str) -> None:
    """Raise a :class:`ConfigError` for ``field`` unless ``condition`` holds (for ``validate``)."""
    if not condition:
        raise ConfigError(f"{field}: {message}")


def is_loopback(host: str, *, resolve: bool = False) -> bool:
    """Whether ``host`` (an IP, ``localhost`` or, with ``resolve``, any name) reaches this
    machine only. Listeners resolve names as the server will bind them; clients need not.
    The one check behind every "loopback unless configured" default and its warnings."""
    host = host.strip("[]")  # [::1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        if not resolve or not host:
            return False
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(name: str) -> str:
    """A TOML key: bare when it may be (``grpc_address``), quoted otherwise (a GPU model)."""
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def to_toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """``data`` as TOML that reads back the same (``None`` values as comments, keys quoted
    where they must be, dicts as tables, dicts in lists as inline tables): the one TOML
    writer (``config check`` prints with it, test helpers write configs with it)."""
    scalars = [f"# {_key(k)} = (unset)" if v is None else f"{_key(k)} = {_toml_value(v)}"
               for k, v in data.items() if not isinstance(v, Mapping)]
    lines = [f"[{prefix}]"] if prefix and (scalars or not data) else []
    lines += scalars or (["# (empty)"] if prefix and not data else [])
    for key, value in data.items():
        if isinstance(value, Mapping):
            lines += ["", to_toml(value, f"{prefix}.{_key(key)}" if prefix else _key(key))]
    return "\n".join(lines).strip("\n")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):  # a table inside a list ([[agent.vllm]]): an inline table
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    return json.dumps(str(value))
