"""A site host's status: what ``fedshard site up`` records about itself in
``<state_dir>/site-status.json`` as it goes, and ``fedshard site status`` prints once (with
the site's privacy ledger and whether ``site up`` still holds the site's lock)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["SITE_ENDED", "SITE_STATUS_FILE", "SiteState", "read_site_state", "write_site_state"]

SITE_STATUS_FILE = "site-status.json"

SITE_ENDED = ("stopped", "failed")
"""The phases ``site up`` records as it ends; any other phase of one that no longer runs means it died."""


@dataclass
class SiteState:
    """What ``site up`` records about itself."""

    site: str
    phase: str = "starting"  # starting, running, retrying, stopped, failed
    pid: int = field(default_factory=os.getpid)
    superlink: str = ""
    executor: str = ""
    supernode_pid: int | None = None
    starts: int = 0  # SuperNode starts so far (a restart follows a lost or refusing SuperLink)
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    message: str = ""  # why it retries, stopped or failed


def write_site_state(state_dir: Path, state: SiteState) -> None:
    """Replace ``site-status.json`` atomically (a write that fails is skipped: the status is a
    report, never what the site decides by)."""
    state.updated_at = time.time()
    tmp = state_dir / f".{SITE_STATUS_FILE}.tmp"
    try:
        tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
        os.replace(tmp, state_dir / SITE_STATUS_FILE)
    except OSError:
        pass


def read_site_state(state_dir: Path) -> SiteState | None:
    """The last recorded state (None: ``site up`` never ran here, or its file is unreadable)."""
    try:
        return SiteState(**json.loads((state_dir / SITE_STATUS_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None
