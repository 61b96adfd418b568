"""Small file-system helpers shared by the packages that write files durably, and the
barrier that lets many writers in one process share one flush.

Every fsync a site's store and ledger make goes through :func:`fsync_fd`, :func:`fsync_file`
or :func:`fsync_dir` (and their ``syncfs`` through :func:`deferring`). Code running under
:func:`deferred_to` a :class:`Barrier` skips those flushes for files on the barrier's file
systems: the writes stay as atomic as before (temporary files, renames, SQLite
transactions), so a killed process loses none of them, and :meth:`Barrier.sync` makes
them all durable at once. The in-process engine runs its sites' messages so
(:class:`~fedshard.transports.inprocess.InProcessSiteGateway`): every site of a batch
writes, one ``syncfs`` per file system, then they release. Whoever defers owns the rule
that nothing derived from a deferred write leaves before the barrier's ``sync``. A zone
called from a deferred site runs :func:`immediate` (its writes are its own promises),
except for the audit records of that site's push and fetch: their flush waits for the
same barrier (the receipt goes only to the deferred site, whose reply waits for the
barrier), and the zone flushes its audit log itself before any sum leaves it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import os
import platform
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar

__all__ = [
    "Barrier",
    "deferred_to",
    "deferring",
    "file_stamp",
    "fsync_dir",
    "fsync_fd",
    "fsync_file",
    "immediate",
    "remove_files",
    "syncfs",
    "syncfs_supported",
]


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int, int, int, int] | None:
    """``path``'s identity and modification stamp (device, inode, size, modification and change
    times): any replacement or write changes it; None if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a directory entry (after creating or renaming a file in it) to disk (deferred
    under a :class:`Barrier` covering it)."""
    if os.name != "posix" or deferring(directory):
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data and metadata to disk through a new descriptor (deferred under a
    :class:`Barrier` covering it)."""
    if deferring(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_fd(fd: int) -> None:
    """``os.fsync(fd)``, deferred under a :class:`Barrier` covering the file's file system."""
    barrier = _barrier.get()
    if barrier is not None and barrier.covers(os.fstat(fd).st_dev):
        return
    os.fsync(fd)


class Barrier:
    """One flush for the writes of many writers of this process on the file systems of ``roots``.

    Made with :meth:`over`; a descriptor on each file system is opened first, so that
    :meth:`sync` reports any write-back error since (see :func:`syncfs`).

    It also removes, on a helper thread, the files its writers no longer need
    (:func:`remove_files`: a store's superseded blobs); an ``unlink`` waits for the disk
    without Python's lock, so the writers go on meanwhile. :meth:`sync` waits for the
    removals handed to it before it flushes.
    """

    def __init__(self, fds: dict[int, int]) -> None:
        self._fds = fds
        self._removing: concurrent.futures.ThreadPoolExecutor | None = None
        self._removals: list[concurrent.futures.Future[None]] = []
        self._lock = threading.Lock()

    @classmethod
    def over(cls, roots: Iterable[str | os.PathLike[str]]) -> Barrier | None:
        """A barrier over the file systems holding ``roots`` (created if missing), or None
        where ``syncfs`` is not available (then every write is flushed as it is made)."""
        if not syncfs_supported():
            return None
        fds: dict[int, int] = {}
        try:
            for root in roots:
                os.makedirs(root, exist_ok=True)
                fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                dev = os.fstat(fd).st_dev
                if dev in fds:
                    os.close(fd)
                else:
                    fds[dev] = fd
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        return cls(fds)

    def covers(self, device: int) -> bool:
        """Whether writes on file system ``device`` wait for :meth:`sync`."""
        return device in self._fds

    def sync(self) -> None:
        """Make every write so far on the barrier's file systems durable (one ``syncfs`` each).

        Raises
        ------
        OSError
            A file system reported an error, or refused ``syncfs``: the writes may not be durable.
        """
        self._wait_removals()
        for fd in self._fds.values():
            if not syncfs(fd):
                raise OSError(errno.ENOSYS, "syncfs is not available")

    def remove(self, paths: Iterable[str]) -> None:
        """Remove ``paths`` on the barrier's helper thread (errors ignored: files nothing reads any
        more, which ``vacuum`` would find); :meth:`sync` waits for it."""
        batch = list(paths)
        with self._lock:
            if self._removing is None:
                self._removing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fedshard-remove")
            self._removals.append(self._removing.submit(_unlink_all, batch))

    def _wait_removals(self) -> None:
        with self._lock:
            removals, self._removals = self._removals, []
        concurrent.futures.wait(removals)

    def close(self) -> None:
        """Finish the removals, close the descriptors (after the last :meth:`sync`)."""
        self._wait_removals()
        with self._lock:
            removing, self._removing = self._removing, None
        if removing is not None:
            removing.shutdown(wait=True)
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


_barrier: ContextVar[Barrier | None] = ContextVar("fedshard_fs_barrier", default=None)


@contextlib.contextmanager
def deferred_to(barrier: Barrier | None) -> Iterator[None]:
    """Within the block (this thread or task), flushes of files on ``barrier``'s file systems wait
    for its :meth:`~Barrier.sync` (None: flush as usual)."""
    token = _barrier.set(barrier)
    try:
        yield
    finally:
        _barrier.reset(token)


def remove_files(paths: Iterable[str]) -> None:
    """Remove ``paths`` (files nothing will read again, on one file system), errors ignored: on the
    helper thread of this thread's or task's barrier if it covers them, else now."""
    batch = list(paths)
    barrier = _barrier.get()
    if barrier is not None and batch:
        try:
            covered = barrier.covers(os.stat(os.path.dirname(batch[0]) or ".").st_dev)
        except OSError:
            covered = False
        if covered:
            barrier.remove(batch)
            return
    _unlink_all(batch)


def immediate() -> contextlib.AbstractContextManager[None]:
    """Within the block every write is flushed as it is made, whatever the caller deferred."""
    return deferred_to(None)


def deferring(path: str | os.PathLike[str]) -> bool:
    """Whether a flush of ``path`` (an existing file or folder) waits for a barrier here."""
    barrier = _barrier.get()
    if barrier is None:
        return False
    try:
        return barrier.covers(os.stat(path).st_dev)
    except OSError:
        return False


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
