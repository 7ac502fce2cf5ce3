"""Telemetry values on a terminal: never markup, never control sequences.

Service names, hosts, models and attribute values come from whoever sends telemetry. Printed
through Rich as plain ``str`` they are parsed as markup (``markup-[/]`` raised a
``MarkupError`` that crashed ``fleetlens sql``; ``[link=http://evil]ok[/link]`` showed "ok" and
hid its target), and raw ESC/OSC bytes would drive the terminal itself (retitle it, hide
text, forge hyperlinks). :func:`cell` turns any value into a Rich ``Text`` (never parsed as
markup) with control characters shown as escapes (``\\x1b``).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from rich.text import Text

# C0 controls but TAB and LF (a table cell may span lines; CR would overwrite the line), DEL,
# C1 controls (0x9b is a one-byte CSI), and the bidirectional overrides/isolates that
# reorder text.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: Longest cell shown: a table is for reading (a 268 MB table once took Rich 5 minutes).
CELL_CHARS = 2000


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: Any) -> str:
    """``value`` as text with control characters escaped (``None`` as an empty string)."""
    return "" if value is None else _CONTROL.sub(_escape, str(value))


def cell(value: Any, style: str = "", limit: int = CELL_CHARS) -> Text:
    """``value`` as a Rich ``Text`` for a table cell or header: no markup, no controls, at
    most ``limit`` characters (the rest counted, not shown)."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit:,} more characters)"
    return Text(plain(text), style=style)


__all__ = ["cell", "plain"]


#: Width of a table that goes to a pipe or a file: its whole lines (one row, one line).
PIPED_WIDTH = 1000


def table_width() -> int | None:
    """The width a table is laid out for: ``None`` (Rich's own: ``$COLUMNS``, else the
    terminal's) on a terminal or when ``$COLUMNS`` says it, else :data:`PIPED_WIDTH`.

    Rich would lay a piped table out for 80 columns and fold its cells, so ``fleetlens
    incidents | grep kv_cache_pressure`` would miss a cause folded in two; a terminal gets
    a table that fits it instead of lines that run past its edge."""
    if os.environ.get("COLUMNS", "").isdigit() or sys.stdout.isatty():
        return None
    return PIPED_WIDTH
