"""The default shard-store backend: one local folder, crash-safe writes.

A write goes to a temporary file under ``.tmp/`` (same file system), is fsync'd,
renamed over its name (``os.replace`` is atomic on POSIX) and the folder entry is
fsync'd (with the parent of any folder the write created), so after a crash or
``SIGKILL`` a name holds either its old bytes or its new ones, and after a power loss
the rename is durable once ``write`` returns.

:meth:`LocalDirBackend.deferred_writes` does the same without waiting for the disk on
each file; its ``sync`` then makes them all durable at once: on Linux one
``syncfs(2)`` of the file system holding ``.tmp/`` (where every temporary is created,
so every renamed file lives there too), which writes back the folders' entries as well
(the file system's metadata is committed with it); elsewhere each file is fsync'd as it
is written and each folder touched once at ``sync``.
"""

from __future__ import annotations

import builtins
import errno
import os
import re
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from fedshard import faults
from fedshard._fs import deferring, fsync_dir, fsync_fd, fsync_file, remove_files, syncfs, syncfs_supported
from fedshard.errors import StoreError
from fedshard.store._backend import TMP_PREFIX, ObjectStat

__all__ = ["LocalDirBackend"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_TMP_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def _make_dirs(directory: str) -> builtins.list[str]:
    """Create ``directory`` and its missing parents; return the folders whose entries changed."""
    parent = os.path.dirname(directory) or os.curdir
    try:
        os.mkdir(directory)
    except FileExistsError:
        return []
    except FileNotFoundError:
        if parent == directory:
            raise
        changed = _make_dirs(parent)
        try:
            os.mkdir(directory)
        except FileExistsError:
            return changed
        return [*changed, parent]
    return [parent]


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


class LocalDirBackend:
    """Named objects as files under ``root``.

    Parameters
    ----------
    root:
        The store's folder; created on the first write.
    durable:
        fsync every write (default). Off, a crash of the process still never leaves a
        torn object (rename is atomic), but a power loss may lose recent writes.
    """

    def __init__(self, root: str | os.PathLike[str], *, durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable
        self._dir = os.fspath(self.root)
        self._tmp_dir = os.path.join(self._dir, TMP_PREFIX.rstrip("/"))

    @property
    def location(self) -> str:
        """The folder, as given."""
        return str(self.root)

    @property
    def local_root(self) -> Path | None:
        """The folder holding the objects."""
        return self.root

    def _path(self, name: str) -> str:
        if not _NAME_RE.match(name) or any(part in (".", "..") for part in name.split("/")):
            raise StoreError(f"invalid object name {name!r} in store {self.root}")
        return os.path.join(self._dir, name)

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Write ``data`` to ``name`` through a temporary file and an atomic rename."""
        path = self._path(name)
        changed = self._put(path, data, fsync=self.durable)
        try:
            if self.durable:
                for directory in dict.fromkeys(changed):  # each once
                    fsync_dir(directory)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None

    def deferred_writes(self) -> _DeferredWrites:
        """Writes made durable together by their ``sync`` (see the module docstring)."""
        return _DeferredWrites(self)

    def _put(self, path: str, data: bytes | memoryview, *, fsync: bool) -> builtins.list[str]:
        """Write ``path`` through a temporary file (fsync'd if ``fsync``) and a rename; return
        the folders whose entries changed (not fsync'd)."""
        tmp = ""
        changed: builtins.list[str] = []
        try:
            fd, tmp, changed = self._temporary(os.path.basename(path))
            try:
                _write_all(fd, data)
                if fsync:
                    fsync_fd(fd)
            finally:
                os.close(fd)
            faults.point("store.file.written")
            parent = os.path.dirname(path)
            try:
                os.replace(tmp, path)
            except FileNotFoundError:  # the folder is new (or was removed): make it, then rename
                changed += _make_dirs(parent)
                os.replace(tmp, path)
            faults.point("store.file.renamed")
            return [*changed, parent]
        except OSError as exc:
            if tmp:
                with suppress(OSError):
                    os.unlink(tmp)
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        except BaseException:
            if tmp:
                with suppress(OSError):
                    os.unlink(tmp)
            raise

    def _temporary(self, base: str) -> tuple[int, str, builtins.list[str]]:
        """A new temporary file under ``.tmp/`` (its descriptor and path), and the folders made for it."""
        changed: builtins.list[str] = []
        for attempt in range(100):
            tmp = os.path.join(self._tmp_dir, f"{base}.{os.urandom(6).hex()}")
            try:
                return os.open(tmp, _TMP_FLAGS, 0o600), tmp, changed
            except FileExistsError:
                continue
            except FileNotFoundError:  # no .tmp/ yet
                if attempt:
                    raise
                changed += _make_dirs(self._tmp_dir)
        raise FileExistsError(errno.EEXIST, "no free temporary name", self._tmp_dir)

    def read(self, name: str) -> bytes | None:
        """The file's bytes, or ``None`` if it does not exist."""
        path = self._path(name)
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None

    def delete(self, name: str) -> None:
        """Remove the file (no error if it is gone)."""
        path = self._path(name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot delete {path}: {exc.strerror or exc}") from None

    def discard(self, names: Iterable[str]) -> None:
        """Remove objects nothing reads any more (a commit's superseded blobs and key table), errors
        ignored (``vacuum`` finds what is left); under a :class:`fedshard._fs.Barrier` covering the
        folder, its helper thread removes them while the writer goes on."""
        remove_files(self._path(name) for name in names)

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Names under ``prefix`` (temporaries excluded), sorted."""
        if not self.root.is_dir():
            return []
        names: builtins.list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            if rel == ".":
                dirnames[:] = [d for d in dirnames if d + "/" != TMP_PREFIX]
                rel = ""
            else:
                rel = rel.replace(os.sep, "/") + "/"
            names.extend(rel + f for f in filenames if (rel + f).startswith(prefix))
        return sorted(names)

    def stat(self, name: str) -> ObjectStat | None:
        """Size of the file, or ``None``."""
        try:
            return ObjectStat(name, os.stat(self._path(name)).st_size)
        except FileNotFoundError:
            return None

    def temporaries(self) -> builtins.list[str]:
        """Leftovers of interrupted writes, under ``.tmp/``."""
        tmp_dir = self.root / TMP_PREFIX
        if not tmp_dir.is_dir():
            return []
        return sorted(TMP_PREFIX + p.name for p in tmp_dir.iterdir())

    def remove_temporaries(self) -> int:
        """Delete the leftovers of interrupted writes; return how many."""
        names = self.temporaries()
        for name in names:
            with suppress(OSError):
                (self.root / name).unlink()
        return len(names)


class _DeferredWrites:
    """:meth:`LocalDirBackend.deferred_writes`: writes of one batch, synced together."""

    def __init__(self, backend: LocalDirBackend) -> None:
        self._backend = backend
        self._files: builtins.list[str] = []
        self._dirs: dict[str, None] = {}  # touched folders, in order, once each
        self._fd: int | None = None  # on .tmp/, opened before the writes: syncfs reports errors since then
        if backend.durable and syncfs_supported():
            try:
                _make_dirs(backend._tmp_dir)
                self._fd = os.open(backend._tmp_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except OSError as exc:
                raise StoreError(f"cannot write to {backend._tmp_dir}: {exc.strerror or exc}") from None

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Write ``name`` atomically; durable after :meth:`sync`."""
        backend = self._backend
        path = backend._path(name)
        # without syncfs each file is fsync'd now, through the descriptor that wrote it
        changed = backend._put(path, data, fsync=backend.durable and self._fd is None)
        self._files.append(path)
        self._dirs.update(dict.fromkeys(changed))

    def sync(self) -> None:
        """Make the writes so far durable: one syncfs (or the files' fsyncs, then each touched folder once);
        under a barrier that covers the store (:class:`fedshard._fs.Barrier`), its sync does it."""
        if not self._backend.durable or deferring(self._backend._tmp_dir):
            self._files.clear()
            self._dirs.clear()
            return
        try:
            synced = self._fd is not None and syncfs(self._fd)  # the data and metadata of the whole file system
            if self._fd is not None and not synced:  # syncfs refused at run time: fsync each file
                for path in self._files:
                    fsync_file(path)
            if not synced:  # (without syncfs each file was fsync'd as it was written) then each folder once
                for directory in self._dirs:
                    fsync_dir(directory)
        except OSError as exc:
            raise StoreError(f"cannot make the writes to {self._backend.root} durable: {exc.strerror or exc}") from None
        self._files.clear()
        self._dirs.clear()

    def close(self) -> None:
        """Release the descriptor held for syncfs."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
