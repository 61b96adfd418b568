"""A shard-store backend on any fsspec file system (``memory://``, ``s3://``, ``gs://``, a local path).

Atomic writes, as fsspec offers no atomic rename everywhere: each write goes to a
fresh temporary key under ``.tmp/`` and is then *moved* onto its name. Where the file
system renames (local, memory) that move is atomic; on object stores a move is a
server-side copy then a delete, and the copy makes the destination appear whole (an
object store never shows a partially uploaded object). So a name holds its old bytes
or its new ones after a crash, never a prefix; a crash between copy and delete only
leaves a temporary behind, which :meth:`FsspecBackend.remove_temporaries` clears.
Shard blobs are moreover written once under names that carry their version, and the
store's one mutable object, its catalog, is the commit point (see
:mod:`fedshard.store.catalog`), so no reader ever depends on an overwrite of a blob.

Durability is the file system's: fsspec's local implementation does not fsync (use
the default :class:`~fedshard.store.local_dir.LocalDirBackend` for a local folder).
For the same reason this backend offers no deferred writes
(:class:`~fedshard.store._backend.DefersSync`): an object store has made an object
durable when it acknowledges the upload, and there is no barrier to share, so a
batch's blobs are written one by one with :meth:`FsspecBackend.write`, each complete
before the catalog that names them is written.
"""

from __future__ import annotations

import builtins
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

from fedshard.errors import StoreError
from fedshard.store._backend import TMP_PREFIX, ObjectStat

__all__ = ["FsspecBackend"]


class FsspecBackend:
    """Named objects under ``url`` on an fsspec file system.

    Parameters
    ----------
    url:
        Any fsspec URL or local path, e.g. ``memory://site-a/store`` or ``s3://bucket/site-a``.
    storage_options:
        Passed to the fsspec file system (credentials, endpoints, ...).
    """

    def __init__(self, url: str, **storage_options: Any) -> None:
        import fsspec  # type: ignore[import-untyped]

        self.url = url
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ValueError, ImportError) as exc:
            raise StoreError(f"cannot open store {url!r} through fsspec: {exc}") from None
        self.root: str = root.rstrip("/")
        self._local = "file" in self.fs.protocol or "local" in self.fs.protocol

    @property
    def location(self) -> str:
        """The URL, as given."""
        return self.url

    @property
    def local_root(self) -> Path | None:
        """The local folder, when the file system is the local one."""
        return Path(self.root) if self._local else None

    def _key(self, name: str) -> str:
        if not name or name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
            raise StoreError(f"invalid object name {name!r} in store {self.url}")
        return f"{self.root}/{name}"

    def _parent(self, key: str) -> None:
        if self._local:  # object stores have no folders; the local file system needs them
            self.fs.makedirs(key.rsplit("/", 1)[0], exist_ok=True)

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Write ``data`` to a temporary key, then move it onto ``name``."""
        key = self._key(name)
        tmp = f"{self.root}/{TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            self._parent(tmp)
            self.fs.pipe_file(tmp, bytes(data))
            self._parent(key)
            self.fs.mv(tmp, key)
        except OSError as exc:
            with suppress(OSError):
                self.fs.rm_file(tmp)
            raise StoreError(f"cannot write {key} in store {self.url}: {exc}") from None

    def read(self, name: str) -> bytes | None:
        """The object's bytes, or ``None`` if it does not exist."""
        key = self._key(name)
        try:
            data: bytes = self.fs.cat_file(key)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {key} in store {self.url}: {exc}") from None
        return data

    def delete(self, name: str) -> None:
        """Remove the object (no error if it is gone)."""
        key = self._key(name)
        with suppress(FileNotFoundError):
            self.fs.rm_file(key)

    def _find(self, under: str) -> builtins.list[str]:
        base = f"{self.root}/{under}".rstrip("/")
        try:
            found: list[str] = self.fs.find(base)
        except FileNotFoundError:
            return []
        root = self.root.lstrip("/")
        return sorted(p.lstrip("/")[len(root) + 1 :] for p in found)

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Names under ``prefix`` (temporaries excluded), sorted."""
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        return [n for n in self._find(folder) if n.startswith(prefix) and not n.startswith(TMP_PREFIX)]

    def stat(self, name: str) -> ObjectStat | None:
        """Size of the object, or ``None``."""
        try:
            info = self.fs.info(self._key(name))
        except FileNotFoundError:
            return None
        if info.get("type") != "file":
            return None
        return ObjectStat(name, int(info["size"]))

    def temporaries(self) -> builtins.list[str]:
        """Leftovers of interrupted writes, under ``.tmp/``."""
        return self._find(TMP_PREFIX)

    def remove_temporaries(self) -> int:
        """Delete the leftovers of interrupted writes; return how many."""
        names = self.temporaries()
        for name in names:
            with suppress(FileNotFoundError):
                self.fs.rm_file(f"{self.root}/{name}")
        return len(names)
