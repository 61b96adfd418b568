"""Last-access times of a store's shards, for tiering (clock injectable for tests).

A shard's last access is the later of its last write (recorded in the catalog) and
its last read (kept here). Reads are recorded in memory and saved in the store's
``access`` object on :meth:`AccessLog.flush` (the store flushes when it closes and
when it tiers), not on every read: a read must not cost a write. Access times are
advisory: if the object is lost or damaged, shards count as last used when written,
which only makes them look colder.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable

from fedshard.store._backend import Backend

__all__ = ["ACCESS", "AccessLog", "Clock", "system_clock"]

ACCESS = "access"  # the object name in the backend
Clock = Callable[[], float]  # seconds since the epoch, like time.time
log = logging.getLogger(__name__)


def system_clock() -> float:
    """The wall clock (``time.time``)."""
    return time.time()


class AccessLog:
    """Read times of shards, kept in a store's backend.

    Parameters
    ----------
    backend:
        The store's backend (the ``access`` object).
    clock:
        Time source; inject a fake one in tests.
    """

    def __init__(self, backend: Backend, clock: Clock = system_clock) -> None:
        self._backend = backend
        self.clock = clock
        self._lock = threading.Lock()
        self._times: dict[str, float] = {}
        self._dirty = False
        raw = backend.read(ACCESS)
        if raw is not None:
            try:
                loaded = json.loads(raw)
                self._times = {str(k): float(v) for k, v in loaded.items()}
            except (ValueError, TypeError, AttributeError):
                log.warning(
                    "access times of store %s are unreadable; shards count as last used when written", backend.location
                )

    def touch(self, shard_id: str) -> None:
        """Record a read of ``shard_id`` now."""
        now = self.clock()
        with self._lock:
            self._times[shard_id] = now
            self._dirty = True

    def last_read(self, shard_id: str) -> float | None:
        """Time of the last recorded read, or ``None``."""
        return self._times.get(shard_id)

    def forget(self, shard_ids: Iterable[str]) -> None:
        """Drop the read times of shards that were deleted or written again."""
        with self._lock:
            for sid in shard_ids:
                if self._times.pop(sid, None) is not None:
                    self._dirty = True

    def flush(self) -> None:
        """Save the read times in the backend (if any changed)."""
        with self._lock:
            if not self._dirty:
                return
            data = json.dumps(self._times, separators=(",", ":")).encode()
            self._dirty = False
        self._backend.write(ACCESS, data)
