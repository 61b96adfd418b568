"""Where a shard store's bytes live: the :class:`Backend` protocol.

A backend holds named byte objects (``catalog``, ``blobs/3f/…v2``) and knows nothing
of shards, keys or formats. What the store needs from it:

* ``write`` is **atomic**: after a crash the name holds the old bytes or the new
  ones, never a mix or a prefix;
* ``read`` returns exactly what was written (or ``None``: no such object);
* temporary objects of interrupted writes are listed by ``temporaries`` and removed
  by ``remove_temporaries``, never seen by ``list``.

Optionally (:class:`DefersSync`), a backend whose ``write`` waits for the disk on each
object can open :class:`DeferredWrites`: writes just as atomic, made durable all at once
by ``sync`` — one barrier for a batch of shard blobs instead of one per blob. The
store's commit (:class:`~fedshard.store._commit.Committer`) writes a batch's blobs that
way and syncs them before it writes the key table and the catalog; without the option
it writes each blob with ``write``.

Backends: :class:`~fedshard.store.local_dir.LocalDirBackend` (the default; a local
folder, fsync'd) and :class:`~fedshard.store._fsspec_backend.FsspecBackend` (any fsspec
URL: ``memory://``, ``s3://``, a local path, …). :func:`backend_for` picks one.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["TMP_PREFIX", "Backend", "DeferredWrites", "DefersSync", "Discards", "ObjectStat"]

TMP_PREFIX = ".tmp/"  # temporaries of in-progress writes, under the store's root


@dataclass(frozen=True, slots=True)
class ObjectStat:
    """Name and size in bytes of one stored object."""

    name: str
    size: int


@runtime_checkable
class Backend(Protocol):
    """Named byte objects with atomic writes (see the module docstring)."""

    @property
    def location(self) -> str:
        """Where the objects are, for messages (a folder or a URL)."""
        ...

    @property
    def local_root(self) -> Path | None:
        """The local folder holding the objects, if any (a KEK file must not be inside it)."""
        ...

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``name`` atomically, replacing what was there."""
        ...

    def read(self, name: str) -> bytes | None:
        """The bytes stored under ``name``, or ``None`` if there is no such object."""
        ...

    def delete(self, name: str) -> None:
        """Remove ``name``; no error if it does not exist."""
        ...

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Names of the stored objects starting with ``prefix``, sorted (temporaries excluded)."""
        ...

    def stat(self, name: str) -> ObjectStat | None:
        """Size of ``name``, or ``None`` if there is no such object."""
        ...

    def temporaries(self) -> builtins.list[str]:
        """Names of the temporaries left by interrupted writes."""
        ...

    def remove_temporaries(self) -> int:
        """Delete the temporaries of interrupted writes (only while nothing writes); return how many."""
        ...


@runtime_checkable
class DeferredWrites(Protocol):
    """Writes to one backend that become durable together, at :meth:`sync`."""

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``name`` atomically, as :meth:`Backend.write`, but durable only after :meth:`sync`."""
        ...

    def sync(self) -> None:
        """Make every write so far durable (a power loss after this returns keeps them all).

        Raises ``StoreError`` if that cannot be guaranteed (the disk reported an error).
        """
        ...

    def close(self) -> None:
        """Release what the writes hold; writes not synced may be lost in a power loss."""
        ...


@runtime_checkable
class Discards(Protocol):
    """A backend that removes objects nothing reads any more in bulk, perhaps later (optional)."""

    def discard(self, names: Iterable[str]) -> None:
        """Remove ``names`` (a commit's superseded objects), errors ignored; they may linger a while,
        never read (what a crash leaves is found by ``vacuum``)."""
        ...


@runtime_checkable
class DefersSync(Protocol):
    """A backend that can make a batch of writes durable with one barrier (optional)."""

    def deferred_writes(self) -> DeferredWrites:
        """Open a set of writes made durable together (see :class:`DeferredWrites`)."""
        ...
