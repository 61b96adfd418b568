"""Freed heap memory goes back to the system (glibc's ``malloc_trim``), which is what keeps a
process that builds and drops sites round after round from growing (see :mod:`fedshard._heap`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from fedshard._heap import _malloc_trim

PROGRAM = textwrap.dedent(
    """
    import threading, psutil
    from fedshard._heap import release_free_memory
    kept = []
    def work():
        blocks = [bytearray(4096) for _ in range(50_000)]  # 200 MB through malloc, in this thread's arena
        kept.extend(blocks[::100])  # a few survive, scattered: the arena cannot shrink from its top
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    process = psutil.Process()
    before = process.memory_info().rss
    release_free_memory()
    print(before, process.memory_info().rss)
    """
)


@pytest.mark.skipif(_malloc_trim() is None, reason="not glibc: nothing to trim")
def test_memory_a_worker_thread_freed_is_given_back() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True).stdout
    before, after = map(int, out.split())
    assert before > 150 << 20  # the freed 198 MB were still held
    assert after < before - (120 << 20)  # and are given back


def test_trimming_is_reported_where_glibc_is_the_allocator() -> None:
    import platform

    from fedshard._heap import release_free_memory

    assert release_free_memory() is (platform.libc_ver()[0] == "glibc")
