"""The site's shard store: every shard encrypted at rest, verified on read, tiered hot/cold.

:class:`SealedShardStore` implements :class:`~fedshard.store._protocol.ShardStore` on a
:class:`~fedshard.store._backend.Backend`. Objects on the backend::

    catalog                   index + metadata of generation g: replacing it is the commit
    keys/<g>                  the data keys of generation g, sealed under the KEK
    blobs/<h2>/<h>.v<n>       version n of one shard (h = SHA-256 of its id), write-once
    access                    last read times (advisory)
    rotation                  journal of an interrupted key rotation, if any
    .tmp/…                    temporaries of interrupted writes

A write seals the shard under a fresh data key into a *new* blob
(:func:`~fedshard.store._shard_io.seal_shard`), then commits (the batch's blobs made
durable together, then key table, then catalog:
:class:`~fedshard.store._commit.Committer`, :mod:`fedshard.store.catalog`); the
superseded blob is deleted only after the commit. A crash at any point leaves the
previous version readable (its blob and its key are still what the catalog names). A
read (:func:`~fedshard.store._shard_io.read_shard`) checks, in order: the blob exists and
is whole, it is this store's, this shard's and this version's (swap and rollback), the
AES-GCM tag (any other change), then the BLAKE3 shard digest the catalog records for it.

The store holds the data keys in memory while it is open. One writer at a time;
reads may run in threads (the prefetching loader does), alongside no writer.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard import faults
from fedshard.crypto.at_rest import Kek, check_key_location
from fedshard.errors import ShardIntegrityError, ShardNotFoundError, StoreError
from fedshard.integrity.digest import shard_digest
from fedshard.store._backend import Backend
from fedshard.store._commit import Committer, read_catalog
from fedshard.store._protocol import ShardStat, ShardStore, Tier
from fedshard.store._shard_io import BLOBS, ColdCodes, blob_name, normalise, read_codes, read_shard, seal_shard
from fedshard.store.access import AccessLog, Clock, system_clock
from fedshard.store.catalog import CATALOG, KEYS_PREFIX, Catalog, CatalogEntry, keys_name
from fedshard.store.location import backend_for
from fedshard.store.quantize import ColdFormat, encodable
from fedshard.store.tiering import StoreStats, TierReport, store_stats

__all__ = ["SealedShardStore", "blob_name"]


class SealedShardStore:
    """An encrypted, tiered shard store (see the module docstring). Use :meth:`open` or :meth:`create`.

    Parameters
    ----------
    backend:
        Where the objects live.
    catalog:
        The authenticated catalog.
    kek:
        The store's key-encryption key.
    clock:
        Time source for write and access times.
    """

    def __init__(self, backend: Backend, catalog: Catalog, kek: Kek, clock: Clock = system_clock) -> None:
        self.backend = backend
        self._cat = catalog
        self.clock = clock
        self._access = AccessLog(backend, clock)
        self._tx = Committer(backend, catalog, kek)
        self._digested: set[tuple[str, int]] = set()  # (shard, version) whose digest a read checked

    # opening -----------------------------------------------------------------------------
    @classmethod
    def open(
        cls, location: str | Path | Backend, kek: Kek, *, clock: Clock = system_clock, create: bool = False
    ) -> SealedShardStore:
        """Open the store at ``location`` (a folder, an fsspec URL or a backend) with its KEK.

        Parameters
        ----------
        create:
            An empty store if there is none, written by its first commit (a batch that writes
            into it creates it with its first objects: one commit, not two); :meth:`create`
            writes it at once.

        Raises
        ------
        StoreError
            No store there (and not ``create``), or its catalog is corrupt or altered.
        StoreKeyError
            ``kek`` is not the store's key, is retired, or its file is inside the store.
        """
        backend = backend_for(location)
        check_key_location(kek.source, backend.local_root)
        catalog = read_catalog(backend, kek)
        if catalog is None:
            if not create:
                raise StoreError(f"no shard store at {backend.location} (no catalog there)")
            return cls(backend, Catalog(store_id=uuid.uuid4().hex, kek_id=kek.kek_id), kek, clock)
        return cls(backend, catalog, kek, clock)

    @classmethod
    def create(cls, location: str | Path | Backend, kek: Kek, *, clock: Clock = system_clock) -> SealedShardStore:
        """Create a new, empty store at ``location``; refuse if one exists there."""
        backend = backend_for(location)
        if backend.read(CATALOG) is not None:
            raise StoreError(f"a shard store already exists at {backend.location}")
        store = cls.open(backend, kek, clock=clock, create=True)
        store._tx.commit()  # the empty store, on the backend now
        return store

    @property
    def store_id(self) -> str:
        """The store's random id (bound into every shard's authenticated header)."""
        return self._cat.store_id

    @property
    def kek_id(self) -> str:
        """Id of the KEK that seals the store."""
        return self._cat.kek_id

    @property
    def generation(self) -> int:
        """Number of commits so far."""
        return self._cat.generation

    @property
    def location(self) -> str:
        """The backend's location."""
        return self.backend.location

    # commits ---------------------------------------------------------------------------------
    def batch(self) -> AbstractContextManager[None]:
        """Group writes into one commit: all of them become visible together, or none.

        If the block raises, the store is as before it (blobs written meanwhile are removed).
        """
        return self._tx.batch()

    # writing ------------------------------------------------------------------------------------
    def _write(self, shard_id: str, values: np.ndarray, fmt: ColdFormat | None, source_digest: str | None) -> None:
        old = self._cat.entries.get(shard_id)
        version = old.version + 1 if old else 1
        sealed = seal_shard(self.store_id, shard_id, version, values, fmt, source_digest, self.clock())
        self._tx.write_blob(sealed.name, sealed.blob)
        if old is not None:
            self._tx.supersede(blob_name(shard_id, old.version))
        self._cat.entries[shard_id] = sealed.entry
        self._cat.keys[shard_id] = sealed.data_key

    def put(self, shard_id: str, array: np.ndarray) -> ShardStat:
        """Store ``array`` as the next version of ``shard_id`` at full precision (hot tier).

        Atomic: after a crash the shard reads as this version or the previous one.
        """
        values = normalise(shard_id, array)
        with self.batch():
            self._write(shard_id, values, None, None)
        return self.stat(shard_id)

    def put_many(self, shards: Mapping[str, np.ndarray]) -> list[ShardStat]:
        """Store several shards (hot) in one atomic commit."""
        with self.batch():
            for sid, array in shards.items():
                self._write(sid, normalise(sid, array), None, None)
        return [self.stat(sid) for sid in shards]

    def put_cold(self, shards: Mapping[str, np.ndarray], fmt: ColdFormat) -> list[ShardStat]:
        """Store several shards straight to the cold tier in ``fmt``, in one atomic commit.

        Each keeps the digest of the full-precision values it came from as its source
        digest (as :meth:`tier` does). Shards that are not finite float32/float64 values
        cannot go cold: the whole batch is refused (:class:`StoreError`), nothing stored.
        """
        with self.batch():
            for sid, array in shards.items():
                values = normalise(sid, array)
                if not encodable(values):
                    raise StoreError(f"shard {sid}: only finite float32/float64 values can be stored {fmt.value}")
                self._write(sid, values, fmt, shard_digest(values))
        return [self.stat(sid) for sid in shards]

    def delete(self, shard_id: str) -> None:
        """Remove ``shard_id`` (its blob goes after the commit)."""
        entry = self._entry(shard_id)
        with self.batch():
            del self._cat.entries[shard_id]
            del self._cat.keys[shard_id]
            self._tx.supersede(blob_name(shard_id, entry.version))
        self._access.forget([shard_id])

    def set_meta(self, key: str, value: Any) -> None:
        """Set metadata ``key`` (JSON) in the catalog, atomically."""
        with self.batch():
            self._cat.meta[key] = value

    # reading --------------------------------------------------------------------------------------
    def _entry(self, shard_id: str) -> CatalogEntry:
        try:
            return self._cat.entries[shard_id]
        except KeyError:
            raise ShardNotFoundError(f"no shard {shard_id!r} in store {self.location}") from None

    def get(self, shard_id: str, *, touch: bool = True) -> np.ndarray:
        """The values of ``shard_id`` (dequantised if cold), verified.

        Raises
        ------
        ShardNotFoundError
            The store holds no such shard.
        ShardIntegrityError
            Its stored file is missing, truncated, swapped, rolled back or altered, or its
            values do not match the catalog's digest. Other shards are unaffected.
        """
        entry = self._entry(shard_id)
        faults.point("store.read.shard")
        values = read_shard(self.backend, self.store_id, shard_id, entry, self._cat.keys[shard_id])
        if touch:
            self._access.touch(shard_id)
        return values

    def reread(self, shard_id: str) -> np.ndarray:
        """:meth:`get` for a caller that reads the same shards over and over (a streamed base).

        Every check of :meth:`get` runs on every read but one: the values' BLAKE3 digest
        is checked on this store object's first read of the shard's current version only.
        The AES-GCM tag authenticates the same sealed plaintext each time, so a digest
        that matched once matches again; skipping it cut an int8 read from 1.79 to 1.49 ns per
        value here (``bench/llm_stream.py``). The read
        is not recorded as an access.
        """
        entry = self._entry(shard_id)
        blob = (shard_id, entry.version)
        first = blob not in self._digested
        values = read_shard(self.backend, self.store_id, shard_id, entry, self._cat.keys[shard_id], check_digest=first)
        self._digested.add(blob)
        return values

    def cold_codes(self, shard_id: str) -> ColdCodes:
        """The cold shard ``shard_id``'s codes, decrypted and checked as :meth:`get` checks a read,
        for a caller that keeps them in memory and dequantises them at each use (a base held
        as codes: :class:`~fedshard.store.streamed.StreamedBase`). Not recorded as an access.

        Raises
        ------
        ShardNotFoundError
            The store holds no such shard.
        ShardIntegrityError
            A read check fails, or the shard is not stored cold.
        """
        entry = self._entry(shard_id)
        return read_codes(self.backend, self.store_id, shard_id, entry, self._cat.keys[shard_id])

    def get_many(self, shard_ids: Iterable[str]) -> dict[str, np.ndarray]:
        """``{shard_id: values}`` for each id (see :meth:`get`)."""
        return {sid: self.get(sid) for sid in shard_ids}

    def list(self) -> builtins.list[str]:
        """Ids of the stored shards, sorted."""
        return sorted(self._cat.entries)

    def __len__(self) -> int:
        return len(self._cat.entries)

    def __contains__(self, shard_id: object) -> bool:
        return shard_id in self._cat.entries

    def last_access(self, shard_id: str) -> float:
        """Time of the last read or write of ``shard_id``."""
        entry = self._entry(shard_id)
        read = self._access.last_read(shard_id)
        return entry.written_at if read is None else max(read, entry.written_at)

    def stat(self, shard_id: str) -> ShardStat:
        """What the store records of ``shard_id``."""
        e = self._entry(shard_id)
        return ShardStat(
            shard_id=shard_id,
            version=e.version,
            tier=Tier.COLD if e.cold else Tier.HOT,
            encoding=e.encoding,
            digest=e.digest,
            source_digest=e.source_digest,
            stored_bytes=e.stored_bytes,
            logical_bytes=e.logical_bytes,
            written_at=e.written_at,
            last_access=self.last_access(shard_id),
        )

    def get_meta(self, key: str, default: Any = None) -> Any:
        """Metadata ``key`` from the catalog, or ``default``."""
        return self._cat.meta.get(key, default)

    # tiering ------------------------------------------------------------------------------------------
    def tier(self, older_than: float, fmt: ColdFormat = ColdFormat.INT8) -> TierReport:
        """Move hot shards not read or written for ``older_than`` seconds to the cold tier in ``fmt``.

        One commit for all of them. Shards that are not finite float32/float64 values stay
        hot (listed as skipped); shards that fail their read checks are left as they are
        (listed as damaged: see ``fedshard verify``). The full-precision digest is kept as
        each moved shard's source digest.
        """
        cutoff = self.clock() - older_than
        moved: list[str] = []
        skipped: list[str] = []
        damaged: list[str] = []
        before = after = 0
        with self.batch():
            for sid, entry in list(self._cat.entries.items()):
                if entry.cold or self.last_access(sid) > cutoff:
                    continue
                try:
                    values = self.get(sid, touch=False)
                except ShardIntegrityError:
                    damaged.append(sid)
                    continue
                if not encodable(values):
                    skipped.append(sid)
                    continue
                self._write(sid, values, fmt, entry.source_digest)
                moved.append(sid)
                before += entry.stored_bytes
                after += self._cat.entries[sid].stored_bytes
        self.vacuum()
        self._access.flush()
        return TierReport(fmt.value, moved, skipped, damaged, before, after)

    def stats(self) -> StoreStats:
        """Shards and bytes per tier, and the measured error per cold format."""
        return store_stats(self._cat.entries.values())

    def entries(self) -> dict[str, CatalogEntry]:
        """A copy of the catalog's index."""
        return dict(self._cat.entries)

    # housekeeping ---------------------------------------------------------------------------------------
    def blob_names(self) -> builtins.list[str]:
        """The backend names of the blobs this generation reads, one per shard, in the catalog's order."""
        return [blob_name(sid, e.version) for sid, e in self._cat.entries.items()]

    def named_objects(self) -> builtins.list[str]:
        """The backend names of the objects this generation reads: its key table and the blob of every shard
        (the catalog, :data:`~fedshard.store.catalog.CATALOG`, besides)."""
        return [keys_name(self._cat.generation), *self.blob_names()]

    def orphans(self) -> builtins.list[str]:
        """Blobs and key tables the catalog does not name (left by crashes between a write and its cleanup)."""
        named = set(self.named_objects())
        return [n for n in self.backend.list(BLOBS) + self.backend.list(KEYS_PREFIX) if n not in named]

    def vacuum(self) -> int:
        """Delete orphan blobs and temporaries of interrupted writes; return how many.

        Only while no other process writes the store.
        """
        orphans = self.orphans()
        for name in orphans:
            self.backend.delete(name)
        return len(orphans) + self.backend.remove_temporaries()

    def flush(self) -> None:
        """Save access times."""
        self._access.flush()

    def close(self) -> None:
        """Save access times (the store stays usable)."""
        self.flush()

    def __enter__(self) -> SealedShardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SealedShardStore({self.location!r}, {len(self)} shards, kek={self.kek_id})"


if TYPE_CHECKING:  # mypy checks that the store implements the protocol

    def _implements(store: SealedShardStore) -> ShardStore:
        return store
