"""Tensors fetched on demand in a learned order, a bounded number ahead (the streamed base's prefetcher).

A :class:`WeightStream` serves ``take(key)`` calls: ``key`` is ``(mode, phase, tensor
name)``, e.g. ``("train", "bwd", "blocks.3.ff2.weight")``. The first pass of a mode is
*recorded*: each tensor is fetched when asked for (in the caller's thread) and the key
appended to the mode's schedule. The pass is complete when its first key comes again;
from then on the stream runs ahead of the caller: while the caller computes with the
tensor at position *i* of the schedule, one background thread fetches (reads, decrypts,
dequantises, verifies) positions *i+1 … i+k* (``k`` = ``lookahead``), in order.

If the caller asks for something other than the next key (another mode, a different
batch path), the stream finds that key further on in the schedule, drops what it had
fetched for the positions in between and continues from there; a key the schedule
lacks is fetched on the spot (a *miss*). Correctness never depends on the schedule:
every tensor handed out is the one asked for.

Memory bound: a tensor is *resident* from the moment its array is allocated until the
caller's last reference to it is gone (tracked with a weak-reference finalizer, so the
count is what is really alive). The stream holds at most ``lookahead`` fetched-ahead
tensors and the caller is expected to drop a tensor before it takes the next one, so
at most ``lookahead + 1`` are resident; :attr:`WeightStream.peak_resident` records
the most seen at once. Dropping fetched-ahead work (a mode switch) waits for a fetch
in flight, so the bound holds then too.

Torch-free: the fetch function returns NumPy arrays; :mod:`fedshard.store.streamed`
wraps them in tensors without copying.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field

import numpy as np

from fedshard.errors import StoreError

__all__ = ["StreamStats", "WeightStream"]

Key = tuple[str, str, str]  # (mode, phase, tensor name)
FetchTensor = Callable[[str], np.ndarray]


@dataclass(slots=True)
class StreamStats:
    """Counters of a stream since it was made."""

    fetches: int = 0  # tensors fetched (ahead or on the spot)
    misses: int = 0  # tensors fetched on the spot after the schedule was complete
    dropped: int = 0  # tensors fetched ahead and then not used
    fetch_s: float = 0.0  # time spent fetching (both threads)
    wait_s: float = 0.0  # time the caller waited for a tensor (on-the-spot fetches included)
    fetched_bytes: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # wait seconds per phase


@dataclass(slots=True)
class _Schedule:
    keys: list[Key] = field(default_factory=list)
    complete: bool = False
    pos: int = 0  # index of the next expected key (once complete)


class WeightStream:
    """On-demand tensors with a learned look-ahead (see the module docstring).

    Parameters
    ----------
    fetch:
        Returns the full, verified array of one tensor by name; called from a
        background thread once a schedule is complete.
    lookahead:
        Tensors fetched ahead of the one in use (0: every tensor is fetched when asked).
    niceness:
        Added to the background thread's nice value (Linux: per thread), so that on a
        machine with no spare core the fetching yields to the compute threads (0: none).
    """

    def __init__(self, fetch: FetchTensor, lookahead: int = 2, *, niceness: int = 0) -> None:
        if lookahead < 0:
            raise StoreError(f"lookahead must be 0 or more, got {lookahead}")
        self._fetch_tensor = fetch
        self.lookahead = lookahead
        self.niceness = niceness
        self._schedules: dict[str, _Schedule] = {}
        self._ahead: dict[int, Future[np.ndarray]] = {}  # schedule position -> fetch, of _mode
        self._mode: str | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.resident = 0
        self.peak_resident = 0
        self.resident_bytes = 0
        self.peak_bytes = 0  # most bytes of fetched tensors alive at once
        self.stats = StreamStats()

    # fetching and counting ----------------------------------------------------------------
    def _fetch(self, name: str) -> np.ndarray:
        t0 = time.perf_counter()
        array = self._fetch_tensor(name)
        nbytes = int(array.nbytes)
        with self._lock:
            self.resident += 1
            self.peak_resident = max(self.peak_resident, self.resident)
            self.resident_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
            self.stats.fetches += 1
            self.stats.fetched_bytes += int(array.nbytes)
            self.stats.fetch_s += time.perf_counter() - t0
        weakref.finalize(array, self._released, nbytes)
        return array

    def _released(self, nbytes: int) -> None:
        with self._lock:
            self.resident -= 1
            self.resident_bytes -= nbytes

    def _submit(self, schedule: _Schedule, pos: int) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "fedshard-stream", initializer=self._deprioritise)
        self._ahead[pos] = self._pool.submit(self._fetch, schedule.keys[pos][2])

    def _deprioritise(self) -> None:
        if self.niceness > 0 and hasattr(os, "setpriority"):
            with suppress(OSError):  # a platform without per-thread priorities keeps the default
                os.setpriority(
                    os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + self.niceness
                )

    def _drop(self, keep: set[int] | None = None) -> None:
        """Forget fetched-ahead tensors (all, or those not in ``keep``); wait for one in flight."""
        for pos in [p for p in self._ahead if keep is None or p not in keep]:
            future = self._ahead.pop(pos)
            self.stats.dropped += 1
            if not future.cancel():
                with suppress(Exception):  # its error belongs to a tensor nobody asked for
                    future.result()  # in flight: wait, so the resident bound holds

    # the caller's side ------------------------------------------------------------------------
    def take(self, key: Key) -> np.ndarray:
        """The array of tensor ``key[2]``; ``key`` also places the request in its mode's schedule.

        Raises whatever the fetch raised for this tensor (e.g. the store's
        :class:`~fedshard.errors.ShardIntegrityError`).
        """
        phase = key[1]
        t0 = time.perf_counter()
        try:
            return self._take(key)
        finally:
            waited = time.perf_counter() - t0
            self.stats.wait_s += waited
            self.stats.phases[phase] = self.stats.phases.get(phase, 0.0) + waited

    def _take(self, key: Key) -> np.ndarray:
        mode = key[0]
        schedule = self._schedules.setdefault(mode, _Schedule())
        if mode != self._mode:
            self._drop()
            self._mode = mode
        if not schedule.complete:
            if schedule.keys and key == schedule.keys[0]:
                schedule.complete = True  # a pass went by: the schedule is learned
                schedule.pos = 0
            else:
                schedule.keys.append(key)
                return self._fetch(key[2])
        n = len(schedule.keys)
        pos = self._find(schedule, key)
        if pos is None:
            self._drop()
            self.stats.misses += 1
            return self._fetch(key[2])
        window = {(pos + i) % n for i in range(min(self.lookahead + 1, n))}
        self._drop(keep=window)
        future = self._ahead.pop(pos, None)
        array = future.result() if future is not None else self._fetch(key[2])
        schedule.pos = (pos + 1) % n
        if self.lookahead:
            for i in range(min(self.lookahead, n - 1)):
                ahead = (schedule.pos + i) % n
                if ahead not in self._ahead:
                    self._submit(schedule, ahead)
        return array

    @staticmethod
    def _find(schedule: _Schedule, key: Key) -> int | None:
        n = len(schedule.keys)
        for i in range(n):
            pos = (schedule.pos + i) % n
            if schedule.keys[pos] == key:
                return pos
        return None

    def schedule(self, mode: str) -> list[Key]:
        """The keys recorded for ``mode`` (empty if none yet)."""
        return list(self._schedules.get(mode, _Schedule()).keys)

    def close(self) -> None:
        """Drop what was fetched ahead and stop the background thread (a later take restarts it)."""
        self._drop()
        self._mode = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
