"""One ``fedshard aggregator up`` (one ``fedshard site up``) per state folder, and the
truth about whether it runs.

The aggregator holds an advisory lock on ``<state_dir>/aggregator.lock`` for as long as
it lives, a site's ``site up`` one on ``<site state_dir>/site.lock`` (two SuperNodes of one
site would train on, and spend from, one ledger at once). The kernel releases the lock when
the process ends, ``kill -9`` included, so:

* a second ``aggregator up`` on the same state folder is refused in one line before it
  writes anything (it would otherwise overwrite the first one's ``status.json``);
* ``aggregator status`` and ``aggregator stop`` ask the lock whether the aggregator runs.
  A recorded pid may be stale, or may belong to some other process by now.

Children never inherit the lock's descriptor (``subprocess`` closes it in them), so a
child that outlives the aggregator cannot hold it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from fedshard.errors import DeployError

__all__ = ["LOCK_FILE", "SITE_LOCK_FILE", "holding", "is_held"]

LOCK_FILE = "aggregator.lock"
SITE_LOCK_FILE = "site.lock"

_HOLDERS = {
    LOCK_FILE: (
        "another aggregator",
        "`fedshard aggregator status` shows it, `fedshard aggregator stop` stops it (same --config)",
    ),
    SITE_LOCK_FILE: (
        "another `site up`",
        "`fedshard site status` shows it, Ctrl-C (or SIGTERM) in its terminal stops it",
    ),
}
"""Lock file → who holds it, and how the operator sees and stops that holder."""


@contextlib.contextmanager
def holding(state_dir: Path, pid: int | None = None, *, lock_file: str = LOCK_FILE) -> Iterator[None]:
    """Hold the state folder's lock (``lock_file``: the aggregator's, or a site's) for the block.

    Raises
    ------
    DeployError
        One line: another aggregator (or ``site up``) holds it (``pid``: what its status
        file records), with the commands that show and stop it.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(state_dir / lock_file)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        who, commands = _HOLDERS[lock_file]
        held = f" (pid {pid})" if pid is not None else ""
        raise DeployError(f"{who}{held} runs with state folder {state_dir}: {commands}") from None
    try:
        yield
    finally:
        lock.release()


def is_held(state_dir: Path, lock_file: str = LOCK_FILE) -> bool:
    """Whether an aggregator (or ``site up``: ``lock_file``) runs with ``state_dir`` now (its lock is held)."""
    path = state_dir / lock_file
    if not path.exists():
        return False
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False
