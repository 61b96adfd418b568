"""Small file-system helpers shared by the packages that write files durably."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir"]


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry (after creating or renaming a file in it) to disk."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
