"""A site's privacy ledger kept open between messages while its files are as the site left them.

Opening a ledger checks the whole SQLite file (``quick_check``); closing it checkpoints its
write-ahead log into the database and deletes it, and the next write creates it again:
five disk flushes per round where the reservation needs one. A long-lived process (the
in-process engine, a simulation actor) paid them for every message of every site.
:class:`KeptLedger` keeps the connection after a message and hands it to the next one if
the ledger's files (the database and its log) still have the identity, size and
modification time they had when the site put it back: a file replaced, restored or written
by anyone else changes them, and the next message opens and checks it afresh. The site's
own checks (the anchor, the coordinator's head) run on every message either way, and every
read or write still verifies the rows' MAC chain. Closing the site (the end of a
simulation) closes it: a stopped site leaves its ledger checkpointed, in one file.

Open ledgers hold file descriptors (up to four each); a process keeps at most
:func:`keep_limit` of them open (a quarter of what its soft limit on open files leaves
beyond a reserve), closing the others after each message as before.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

from fedshard.privacy.ledger import PrivacyLedger

__all__ = ["KeptLedger", "keep_limit"]

_RESERVED_FDS = 512
_FDS_PER_LEDGER = 4
_kept = 0
_kept_lock = threading.Lock()

Signature = tuple[tuple[int, int, int] | None, ...]


def keep_limit() -> int:
    """Most ledgers this process keeps open at once (from its soft limit on open files)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(0, (soft - _RESERVED_FDS) // _FDS_PER_LEDGER)


def _signature(path: Path) -> Signature:
    """Identity, size and modification time of the ledger's database and write-ahead log."""
    out: list[tuple[int, int, int] | None] = []
    for name in (path, path.with_name(path.name + "-wal")):
        try:
            st = os.stat(name)
        except FileNotFoundError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class KeptLedger:
    """At most one open ledger of one site, kept between messages (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ledger: PrivacyLedger | None = None
        self._signature: Signature = ()

    def take(self) -> PrivacyLedger | None:
        """The kept ledger if its files are as the site left them (the caller's until
        :meth:`put_back`); else None, the kept one closed."""
        ledger, self._ledger = self._ledger, None
        if ledger is None:
            return None
        _release_slot()
        if _signature(self.path) == self._signature:
            return ledger
        ledger.close()
        return None

    def put_back(self, ledger: PrivacyLedger) -> None:
        """Keep ``ledger`` (the message is done with it) if this process may keep one more open; else close it."""
        if self._ledger is ledger:
            return
        self.drop()  # never two of one site
        if not _take_slot():
            ledger.close()
            return
        self._ledger, self._signature = ledger, _signature(self.path)

    def drop(self, ledger: PrivacyLedger | None = None) -> None:
        """Close ``ledger`` (a message that failed with it) and the kept one."""
        if ledger is not None and ledger is not self._ledger:
            ledger.close()
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
            _release_slot()


def _take_slot() -> bool:
    global _kept
    with _kept_lock:
        if _kept >= keep_limit():
            return False
        _kept += 1
        return True


def _release_slot() -> None:
    global _kept
    with _kept_lock:
        _kept = max(0, _kept - 1)
