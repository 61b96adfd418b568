"""The default shard-store backend: one local folder, crash-safe writes.

A write goes to a temporary file under ``.tmp/`` (same file system), is fsync'd,
renamed over its name (``os.replace`` is atomic on POSIX) and the folder entry is
fsync'd, so after a crash or ``SIGKILL`` a name holds either its old bytes or its new
ones, and after a power loss the rename is durable once ``write`` returns.
"""

from __future__ import annotations

import builtins
import os
import re
import tempfile
from contextlib import suppress
from pathlib import Path

from fedshard._fs import fsync_dir
from fedshard.errors import StoreError
from fedshard.store.backend import TMP_PREFIX, ObjectStat

__all__ = ["LocalDirBackend"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


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

    @property
    def location(self) -> str:
        """The folder, as given."""
        return str(self.root)

    @property
    def local_root(self) -> Path | None:
        """The folder holding the objects."""
        return self.root

    def _path(self, name: str) -> Path:
        if not _NAME_RE.match(name) or any(part in (".", "..") for part in name.split("/")):
            raise StoreError(f"invalid object name {name!r} in store {self.root}")
        return self.root / name

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Write ``data`` to ``name`` through a temporary file and an atomic rename."""
        path = self._path(name)
        tmp_dir = self.root / TMP_PREFIX
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", dir=tmp_dir)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                if self.durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
            if self.durable:
                fsync_dir(path.parent)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(tmp)
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise

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
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot delete {path}: {exc.strerror or exc}") from None

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
            return ObjectStat(name, self._path(name).stat().st_size)
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
