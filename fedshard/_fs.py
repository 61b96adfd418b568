"""Small file-system helpers shared by the packages that write files durably."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import re
import sys
from collections.abc import Callable

__all__ = ["fsync_dir", "fsync_file", "syncfs", "syncfs_supported"]


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a directory entry (after creating or renaming a file in it) to disk."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data and metadata to disk (through a new descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def _libc_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs``, where it can be trusted: Linux 5.8 or later (before, ``syncfs(2)``
    returned 0 even when writing a file back had failed) and a libc that has it."""
    if not sys.platform.startswith("linux"):
        return None
    version = re.match(r"(\d+)\.(\d+)", platform.release())
    if version is None or (int(version[1]), int(version[2])) < (5, 8):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_refused: list[bool] = []  # set once syncfs failed with ENOSYS (a sandbox filtering it)


def syncfs_supported() -> bool:
    """True where :func:`syncfs` may flush a whole file system (Linux 5.8+ with libc's ``syncfs``)."""
    return _libc_syncfs() is not None and not _refused


def syncfs(fd: int) -> bool:
    """Flush every file of the file system holding ``fd`` to disk (Linux ``syncfs(2)``).

    ``fd`` should be opened *before* the writes it is to make durable: the kernel
    reports the write-back errors that happened since then.

    Returns
    -------
    bool
        ``False`` if ``syncfs`` is not available here (then nothing was flushed:
        fsync each file instead).

    Raises
    ------
    OSError
        The file system reported an error: some data may not be on disk.
    """
    fn = _libc_syncfs()
    if fn is None or _refused:
        return False
    if fn(fd) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOSYS:  # e.g. filtered by a sandbox
        _refused.append(True)
        return False
    raise OSError(err, os.strerror(err))
