"""The sealed store's commit path: reading the catalog and its key table, writing them back.

:func:`read_catalog` opens the catalog of the current generation with its key table
(refusing a store whose key rotation to this KEK was interrupted). A
:class:`Committer` groups a store's writes into batches: it writes the batch's blobs
(removed if the batch fails) and remembers those it supersedes (removed once it
commits), and commits by writing ``keys/<g+1>``, making it and the batch's blobs durable, and then
replacing ``catalog`` — that replacement is the commit
(:mod:`fedshard.store.catalog`). A crash at any point leaves the previous generation
readable.

Durability costs one barrier per batch, not one per blob: on a backend that
:class:`~fedshard.store._backend.DefersSync`, a batch's blobs are written as
:class:`~fedshard.store._backend.DeferredWrites`, the key table with them, and synced
together before the catalog is written with ``Backend.write`` (durable on its own); a
batch without blobs (metadata only) writes its key table with ``Backend.write`` too. So
the catalog never names a blob or a key table that a power loss can take.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from fedshard import faults
from fedshard.crypto.at_rest import Kek
from fedshard.errors import StoreError, StoreKeyError
from fedshard.store._backend import Backend, DeferredWrites, DefersSync, Discards
from fedshard.store.catalog import CATALOG, Catalog, catalog_header, keys_header, keys_name
from fedshard.store.rotation import pending_rotation

__all__ = ["Committer", "read_catalog"]

log = logging.getLogger(__name__)


def read_catalog(backend: Backend, kek: Kek) -> Catalog | None:
    """The store's catalog with its data keys, authenticated with ``kek``; ``None`` if there is no store.

    Raises
    ------
    StoreError
        The key table is missing, or the catalog or key table is corrupt or altered.
    StoreKeyError
        ``kek`` is not the store's key, is retired, or a rotation to it was interrupted.
    """
    raw = backend.read(CATALOG)
    if raw is None:
        return None
    generation = int(catalog_header(raw)["generation"])
    raw_keys = backend.read(keys_name(generation))
    if raw_keys is None:
        name = keys_name(generation)
        raise StoreError(f"the key table of store {backend.location} ({name}) is missing; restore it from a backup")
    journal = pending_rotation(backend)
    if journal is not None and journal["to"] == kek.kek_id and keys_header(raw_keys)["kek"] == journal["from"]:
        raise StoreKeyError(
            f"a key rotation to key {kek.kek_id} was interrupted before it committed: finish it with "
            f"`fedshard keys rotate --store {backend.location} --key-file OLD --new-key-file NEW` "
            "(or open the store with the old key)"
        )
    return Catalog.unseal(raw, raw_keys, kek)


class Committer:
    """Batches of writes to one store, committed together or not at all.

    Parameters
    ----------
    backend:
        Where the store's objects live.
    catalog:
        The store's in-memory catalog; a batch changes it in place, a failed batch
        restores it.
    kek:
        The key-encryption key that seals the key table.
    """

    def __init__(self, backend: Backend, catalog: Catalog, kek: Kek) -> None:
        self.backend = backend
        self.catalog = catalog
        self.kek = kek
        self._depth = 0
        self._fresh: list[str] = []  # blobs written by the open batch
        self._garbage: list[str] = []  # blobs the open batch supersedes
        self._pending: DeferredWrites | None = None  # the open batch's blob writes, not yet synced
        self._defers = backend if isinstance(backend, DefersSync) else None

    def write_blob(self, name: str, data: bytes | memoryview) -> None:
        """Write blob ``name`` for the open batch: durable before the batch commits, deleted if it fails.

        Outside a batch the blob is written (durably) at once.
        """
        self._fresh.append(name)
        faults.point("store.write.blob")
        if not self._depth or self._defers is None:
            self.backend.write(name, data)
            return
        if self._pending is None:
            self._pending = self._defers.deferred_writes()
        self._pending.write(name, data)

    def supersede(self, name: str) -> None:
        """Record that the open batch makes ``name`` garbage (deleted once it commits)."""
        self._garbage.append(name)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group writes into one commit: all of them become visible together, or none.

        Nested batches join the outermost one. If the block raises, the catalog is as
        before it and the blobs written meanwhile are removed.
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        cat = self.catalog
        saved = (dict(cat.entries), dict(cat.keys), dict(cat.meta))
        self._depth = 1
        try:
            yield
            self._depth = 0
            self.commit()
        except BaseException:
            self._depth = 0
            cat.entries, cat.keys, cat.meta = saved
            for name in self._fresh:
                with suppress(OSError):
                    self.backend.delete(name)
            self._fresh, self._garbage = [], []
            raise
        finally:
            self._close_pending()

    def _close_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.close()

    def commit(self) -> None:
        """Write the next generation's key table, make it and the batch's blobs durable, then write
        its catalog (the commit); then drop the garbage."""
        cat = self.catalog
        cat.generation += 1
        table = keys_name(cat.generation)
        try:
            catalog, keys = cat.seal(self.kek)
            faults.point("store.commit.keys")
            if self._pending is not None:  # the key table joins the batch's blobs: one barrier for all of them
                self._pending.write(table, keys)
                faults.point("store.commit.sync")
                self._pending.sync()  # every blob and the key table on disk before the catalog names them
            else:
                self.backend.write(table, keys)
            faults.point("store.commit.catalog")
            self.backend.write(CATALOG, catalog)  # the commit
        except BaseException:
            if self._landed():
                log.warning(
                    "store %s: commit %d landed although its write reported an error",
                    self.backend.location,
                    cat.generation,
                )
            else:
                cat.generation -= 1
                with suppress(OSError):
                    self.backend.delete(table)
                raise
        faults.point("store.commit.garbage")
        self._garbage.append(keys_name(cat.generation - 1))
        if isinstance(self.backend, Discards):  # a local folder: under a barrier, by its helper thread
            self.backend.discard(self._garbage)
        else:
            for name in self._garbage:
                with suppress(OSError):
                    self.backend.delete(name)
        self._fresh, self._garbage = [], []

    def _landed(self) -> bool:
        """True if the catalog on the backend is the generation being committed (a write that
        failed after its rename, e.g. in the folder's fsync): then nothing may be rolled back."""
        try:
            raw = self.backend.read(CATALOG)
            return raw is not None and int(catalog_header(raw)["generation"]) == self.catalog.generation
        except (OSError, ValueError):
            return False
