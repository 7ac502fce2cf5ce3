"""Modules a collector process must never load (:func:`keep_out`).

Shared by the supervisor (pyarrow's unused filesystem bindings, before a worker imports
pyarrow.parquet) and the worker (pandas, see ``worker.keep_out_pandas``), in a module of its
own so that neither imports the other.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class KeepOut(importlib.abc.MetaPathFinder):
    """Refuses to import the named modules (and their submodules)."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            raise ModuleNotFoundError(f"{fullname} is kept out of collector workers",
                                      name=fullname)
        return None


def keep_out(*names: str) -> None:
    """Make importing any of ``names`` fail in this process from now on."""
    missing = [n for n in names
               if not any(isinstance(f, KeepOut) and n in f.names for f in sys.meta_path)]
    if missing:
        sys.meta_path.insert(0, KeepOut(*missing))


@contextmanager
def kept_out(*names: str) -> Iterator[None]:
    """Make importing any of ``names`` fail inside the block only.

    For a library that imports an optional dependency at its own import (pyarrow imports
    numpy if it can): the library is imported without it, and code that needs it later, on
    a rare path, may still import it.
    """
    finder = KeepOut(*names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
