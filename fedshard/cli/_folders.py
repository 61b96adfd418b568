"""Where a command writes when its user names no folder."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

__all__ = ["fresh_run_dir"]


def fresh_run_dir(prefix: str = "") -> Path:
    """A folder under ``runs/`` named by the time (and ``prefix``), that no earlier run holds."""
    stamp = f"{prefix}{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    path = Path("runs") / stamp
    n = 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{stamp}-{n}"
    return path
