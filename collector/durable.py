"""Directory entries that survive power loss.

A file's ``fsync`` makes its data durable, not the directory entry that names it: after
``mkdir`` or ``rename`` the parent directory must be fsynced too, or a crash can take the new
directory (and every file published under it) away again.
"""

from __future__ import annotations

from pathlib import Path

from fleetlens.pipeline.storage import fsync_dir


def make_dirs_durable(path: Path) -> None:
    """Create ``path`` and any missing parents, fsyncing the parent of each one created.

    A directory found missing is fsynced into its parent even when another process created
    it first (``FileExistsError``): that process may not have fsynced it yet.
    """
    if path.is_dir():
        return
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            pass
        fsync_dir(folder.parent)
