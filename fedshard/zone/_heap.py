"""Giving freed memory back to the operating system.

A zone stages what it receives in memory allocated by whichever worker thread received
it: the byte strings gRPC hands over (ciphertext, forwarded partial sums; a push's clear
shards are copied into reused buffers instead, :mod:`fedshard.zone._staging`). glibc
keeps freed memory in per-thread arenas, so without a trim a zone's resident size grows
with the number of worker threads that ever staged a push, not with its staging budget
(measured in BENCHMARKS.md). The staging budget (:class:`~fedshard.zone._staging.ByteBudget`)
decides when to trim: only when the staging memory freed since the last trim, plus what
is in use, could exceed it, since each trim makes the next pushes fault their pages in again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["trim_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return trim


def trim_heap() -> bool:
    """Release free heap memory in every malloc arena; False where unsupported."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
