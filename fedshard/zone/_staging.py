"""Reusable staging buffers for pushes: a push's shards are copied out of the frames.

A push is held until it commits (:class:`~fedshard.zone._push.PushSession`). Held as
the byte strings gRPC hands over, each push was staged in memory freshly allocated per
frame and freed at its commit; glibc returns such memory to the system (a heap trim,
or ``munmap`` of a large block), so every push faulted its pages in again, one minor
page fault per 4 KiB staged (measured in BENCHMARKS.md, ``zone_accumulate``: about 40%
of a validated push). Instead, each plaintext shard is copied into a buffer of its size
taken from the zone's :class:`StagingPool` (the frame's bytes are freed at once, and
the next frame reuses them), and the buffers go back to the pool when the push commits
or ends without counting; the next push takes the same, already mapped, buffers.

The pool holds at most its capacity (the zone's staging budget) in buffers lent and
free together: a buffer given back is kept only while that holds, and taking a buffer
of a size with none free first drops free buffers of other sizes to make room. Only a
push larger than the whole budget (which the budget lets through alone) is lent more,
and what it was lent beyond the capacity is dropped when it is given back.

A buffer must not be used after it is given back: a push session takes and gives its
buffers from the one thread that drives it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import numpy as np

from fedshard._heap import release_free_memory

__all__ = ["ByteBudget", "Loan", "StagingPool"]


class StagingPool:
    """Reusable byte buffers (``uint8`` arrays), at most ``capacity`` bytes lent and free together.

    Parameters
    ----------
    capacity:
        The most bytes the pool keeps (a zone: its staging budget).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.allocated = 0
        """Buffers allocated so far (a buffer reused from the pool is not counted)."""
        self._free: dict[int, list[np.ndarray]] = {}  # size → free buffers of that size
        self._free_bytes = 0
        self._lent = 0
        self._lock = threading.Lock()

    @property
    def lent(self) -> int:
        """Bytes of the buffers taken and not yet given back."""
        return self._lent

    @property
    def free(self) -> int:
        """Bytes of the buffers kept for reuse."""
        return self._free_bytes

    def take(self, nbytes: int) -> np.ndarray:
        """A writable ``uint8`` buffer of ``nbytes`` (contents undefined): a free one of that size, else a new one."""
        if nbytes <= 0:
            return np.empty(0, dtype=np.uint8)  # nothing to reuse; not counted
        with self._lock:
            self._lent += nbytes
            stack = self._free.get(nbytes)
            if stack is not None:
                self._free_bytes -= nbytes
                buf = stack.pop()
                if not stack:
                    del self._free[nbytes]
                return buf
            self._make_room()
            self.allocated += 1
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, buffers: Iterable[np.ndarray]) -> int:
        """Give back buffers taken from this pool; they are kept for reuse while the pool
        stays within its capacity, else dropped. Returns the bytes dropped (freed)."""
        dropped = 0
        with self._lock:
            back = [b for b in buffers if b.nbytes]
            self._lent -= sum(b.nbytes for b in back)
            for buf in back:
                if self._lent + self._free_bytes + buf.nbytes <= self.capacity:
                    self._free.setdefault(buf.nbytes, []).append(buf)
                    self._free_bytes += buf.nbytes
                else:
                    dropped += buf.nbytes
        return dropped

    def _make_room(self) -> None:
        """Drop free buffers until what is lent and free fits the capacity (the caller holds the lock)."""
        while self._free and self._lent + self._free_bytes > self.capacity:
            size, stack = next(iter(self._free.items()))
            stack.pop()
            self._free_bytes -= size
            if not stack:
                del self._free[size]


class Loan:
    """The buffers one push or forward took from a pool (none without a pool), given back together.

    Hand :attr:`taker` to the session's :class:`~fedshard.zone.frames.FrameAssembler`;
    call :meth:`give_back` once nothing refers to the buffers (the sums were folded, or
    the session ended), from the thread that drives the session.
    """

    def __init__(self, pool: StagingPool | None) -> None:
        self._pool = pool
        self._buffers: list[np.ndarray] = []  # the pending shard's included

    @property
    def taker(self) -> Callable[[int], np.ndarray] | None:
        """What the assembler calls for a shard's buffer (``None`` without a pool: shards stay as received)."""
        return self._take if self._pool is not None else None

    def _take(self, nbytes: int) -> np.ndarray:
        assert self._pool is not None  # only handed out with a pool
        buf = self._pool.take(nbytes)
        self._buffers.append(buf)
        return buf

    def give_back(self) -> int:
        """Give every buffer back to the pool; the bytes the pool kept (the others were freed)."""
        if not self._buffers:
            return 0
        assert self._pool is not None
        lent = sum(b.nbytes for b in self._buffers)
        kept = lent - self._pool.give(self._buffers)
        self._buffers = []
        return kept


class ByteBudget:
    """A counting semaphore over bytes. A single request larger than the cap is let
    through alone, so it waits instead of deadlocking.

    It also bounds what the allocator may keep of staging memory already freed: bytes
    released count as *retained* (glibc keeps freed memory in the arena of the thread
    that allocated it, where a push received by another worker thread may not reuse it),
    and when the bytes in use plus those retained would exceed the capacity, an acquire
    first hands free heap memory back to the system (:func:`~fedshard._heap.release_free_memory`).
    So staging holds at most about the capacity, and pushes that follow each other reuse
    the pages of the previous ones instead of faulting in fresh pages after a trim per push.
    Bytes staged in reused buffers (:class:`~fedshard.zone._staging.StagingPool`) are not
    freed when they are released, so they do not count as retained (``freed``).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._used = 0
        self._retained = 0  # released since the last trim: freed, perhaps still held by the allocator
        self._cond = threading.Condition()

    def acquire(self, n: int, timeout: float | None = None) -> bool:
        """Reserve ``n`` bytes; False if that did not happen within ``timeout``."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._used == 0 or self._used + n <= self.capacity, timeout) and (
                self._take(n)
            )
            trim = ok and self._used + self._retained > self.capacity
            if trim:
                self._retained = 0
        if trim:
            release_free_memory()
        return ok

    def _take(self, n: int) -> bool:
        self._used += n
        return True

    def release(self, n: int, *, freed: int | None = None) -> None:
        """Return ``n`` bytes to the budget, of which ``freed`` (default: all) had their memory
        freed, perhaps retained by the allocator; the others stay in a staging pool."""
        with self._cond:
            self._used -= n
            self._retained += n if freed is None else freed
            self._cond.notify_all()
