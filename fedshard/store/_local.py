"""Local shard store: named snapshots of ``{shard_id: array}`` plus metadata, on disk.

Each snapshot is one ``.npz`` file written to a temporary name and renamed into
place, so a crash never leaves a half-written snapshot and an existing one is never
damaged by a failed write. Encryption at rest and tiering build on this later.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedshard._fs import fsync_fd
from fedshard.errors import StoreError

__all__ = ["LocalShardStore"]

_META_KEY = "__meta__"
_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


class LocalShardStore:
    """Snapshots of shards under one directory.

    Parameters
    ----------
    root:
        Directory holding the snapshots; created on first write.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        if not _KEY_RE.match(key):
            raise StoreError(f"invalid snapshot name {key!r}: use letters, digits, '.', '_' or '-'")
        return self.root / f"{key}.npz"

    def exists(self, key: str) -> bool:
        """True if a snapshot named ``key`` exists."""
        return self._path(key).exists()

    def save(self, key: str, shards: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Path:
        """Write snapshot ``key`` atomically; returns its path."""
        path = self._path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        arrays = {f"s:{sid}": np.asarray(arr) for sid, arr in shards.items()}
        arrays[_META_KEY] = np.frombuffer(json.dumps(dict(meta), sort_keys=True).encode(), dtype=np.uint8)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)  # type: ignore[arg-type]
                fh.flush()
                fsync_fd(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def load(self, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Read snapshot ``key``; returns ``(meta, shards)``.

        Raises :class:`StoreError` (one line, with the path) if it is missing or corrupt.
        """
        path = self._path(key)
        if not path.exists():
            raise StoreError(f"no snapshot {key!r} in store {self.root}")
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(bytes(data[_META_KEY]).decode())
                shards = {}
                for name in data.files:
                    if name == _META_KEY:
                        continue
                    if not name.startswith("s:"):  # a damaged name must not drop a shard silently
                        raise ValueError(f"unexpected entry {name!r}")
                    shards[name[2:]] = data[name]
        # RuntimeError: zipfile raises it (and NotImplementedError) for damaged header flags.
        except (OSError, ValueError, KeyError, RuntimeError, zipfile.BadZipFile, EOFError) as exc:
            raise StoreError(f"store file {path} is corrupt ({exc}); restore it from a backup or delete it") from None
        return meta, shards

    def keys(self) -> list[str]:
        """Names of the snapshots present, sorted."""
        if not self.root.exists():
            return []
        return sorted(p.stem for p in self.root.glob("*.npz"))
