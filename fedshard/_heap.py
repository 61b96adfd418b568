"""Giving the C heap's free memory back to the operating system.

glibc's allocator keeps memory freed by a thread in that thread's arena and returns it
to the system only when the top of a heap is free. A process that builds and drops
large objects from worker threads round after round (sites training in the in-process
engine, a resumed simulation's fresh sites, a SuperNode child answering message after
message) keeps its peak and then some: measured in ``bench/hf_finetune.py``'s resumed
federations, the resident size grew by about 1.3 GB per resume (six HF sites) while the
live Python objects stayed the same, and one ``malloc_trim(0)`` per resume held it flat.
:func:`release_free_memory` is that call; it costs microseconds when there is nothing to
give back.
"""

from __future__ import annotations

import ctypes
import functools
import sys

__all__ = ["release_free_memory"]


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's ``malloc_trim`` (None on other C libraries and platforms)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's C library; musl and others have none
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return the free pages of every heap arena to the operating system (glibc's
    ``malloc_trim(0)``); False, and nothing done, on other platforms. Safe from any thread."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
