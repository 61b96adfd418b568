"""The catalog (a store's index) and its key table: the commit point of every change.

Two objects on the backend, for generation ``g`` (bumped by every commit):

``catalog``
    ``b"FSCATLG\\x02" | header len (u32) | header (canonical JSON) | index``. The header
    names the store, ``g``, the number of shards and the store's small metadata (model
    version, plan, root); the index lists every shard: id, version, encoding, digest of
    what a read returns, digest of the full-precision values it was written with,
    sizes, write time and, for cold shards, the quantisation error measured when tiered.

``keys/<g>``
    ``b"FSKEYS\\x00\\x02" | header len (u32) | header (canonical JSON) | sealed table``. The
    header names the store, ``g``, the SHA-256 of the catalog's bytes, the id of the KEK
    that seals the table and the KEK ids retired by rotations; the table holds each
    shard version's 32-byte data key (index order), sealed as a whole under the KEK with
    the header as associated data (:func:`fedshard.crypto.at_rest.seal_key_table`). So
    the catalog cannot change, nor the table be moved to another catalog, without the KEK.

A commit writes new shard blobs under fresh names, then ``keys/<g+1>``, then replaces
``catalog`` (atomic): that replacement is the commit. Until it, readers see generation
``g``, whose blobs and key table are still there; after it, ``g+1``; leftovers of a
crash in between are orphans, never read. A key rotation re-seals ``keys/<g>`` in place
(one atomic write of 32 bytes per shard plus a header): the catalog and the shard blobs
are untouched (:meth:`Catalog.rewrap`). The cost of a commit is one catalog write,
O(shards): batch writes (:meth:`fedshard.store.sealed_store.SealedShardStore.batch`).
Format 3 (this one) records BLAKE3 shard digests
(:data:`fedshard.integrity.HASH_NAME`); format 2 recorded SHA-256 ones, which this
version can no longer check, so it refuses such a store with one line, changing
nothing (the cold tier's source digests cannot be recomputed, so there is no
migration in place). Opening a store parses the whole index into memory (a few microseconds per shard:
negligible for models of thousands of shards, seconds for a million).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from fedshard.crypto.at_rest import DATA_KEY_BYTES, Kek, open_key_table, seal_key_table
from fedshard.errors import StoreError, StoreKeyError
from fedshard.integrity.canonical import canonical_json

__all__ = [
    "CATALOG",
    "ENCODINGS",
    "KEYS_PREFIX",
    "Catalog",
    "CatalogEntry",
    "catalog_header",
    "check_kek",
    "keys_header",
    "keys_name",
]

CATALOG = "catalog"  # object names in the backend
KEYS_PREFIX = "keys/"
_CAT_MAGIC = b"FSCATLG\x02"
_KEYS_MAGIC = b"FSKEYS\x00\x02"
_PREFIX = struct.Struct("<8sI")
_FORMAT = 3  # 3: BLAKE3 digests; 2: SHA-256 (refused, see the module docstring)
_SHA256_FORMAT = 2
_AAD_DOMAIN = b"fedshard/key-table/v2\x00"
ENCODINGS = ("full", "fp8", "int8", "int4")  # index codes 0..3
_ENTRY = np.dtype(
    [
        ("version", "<u8"),
        ("encoding", "u1"),
        ("digest", "u1", (32,)),
        ("source", "u1", (32,)),
        ("stored", "<u8"),
        ("logical", "<u8"),
        ("values", "<u8"),
        ("written", "<f8"),
        ("err_max", "<f8"),
        ("err_sq", "<f8"),
        ("ref_sq", "<f8"),
    ]
)


class CatalogEntry(NamedTuple):
    """What the catalog records of one shard."""

    version: int
    encoding: str  # "full" (hot) or a cold format
    digest: str  # shard_digest of what a read returns
    source_digest: str  # shard_digest of the full-precision values written
    stored_bytes: int  # size of the blob
    logical_bytes: int  # size of the full-precision values
    values: int  # number of values
    written_at: float  # clock time of the write (or of the move to the cold tier)
    err_max: float = 0.0  # cold only: max |decoded - original|
    err_sq: float = 0.0  # cold only: sum of squared errors
    ref_sq: float = 0.0  # cold only: sum of squared original values

    @property
    def cold(self) -> bool:
        """True when the shard is in the cold tier."""
        return self.encoding != "full"


def keys_name(generation: int) -> str:
    """The backend name of the key table of ``generation``."""
    return f"{KEYS_PREFIX}{generation:012d}"


def _canonical(doc: dict[str, Any]) -> bytes:
    return canonical_json(doc, allow_nan=True)


def _split(raw: bytes | memoryview, magic: bytes, what: str) -> tuple[bytes, memoryview]:
    view = memoryview(raw)
    if len(view) < _PREFIX.size:
        raise StoreError(f"the store's {what} is truncated; restore it from a backup")
    found, hlen = _PREFIX.unpack_from(view)
    if found != magic:
        raise StoreError(f"the store's {what} is not a fedshard {what} (bad magic); restore it from a backup")
    if _PREFIX.size + hlen > len(view):
        raise StoreError(f"the store's {what} is truncated; restore it from a backup")
    return bytes(view[_PREFIX.size : _PREFIX.size + hlen]), view[_PREFIX.size + hlen :]


def _header(raw_header: bytes, what: str, required: set[str]) -> dict[str, Any]:
    try:
        doc = json.loads(raw_header)
    except ValueError:
        raise StoreError(f"the store's {what} header is corrupt; restore it from a backup") from None
    if isinstance(doc, dict) and doc.get("format") == _SHA256_FORMAT:
        raise StoreError(
            f"the store's {what} is of format 2: the store was written by fedshard before BLAKE3 shard digests "
            "and this version cannot check its SHA-256 ones; write the model into a new store with this version "
            "(or read this one with the release that wrote it)"
        )
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise StoreError(f"the store's {what} has an unknown format; upgrade fedshard or restore it")
    if not required <= set(doc):
        raise StoreError(f"the store's {what} header is incomplete; restore it from a backup")
    return doc


def catalog_header(raw_catalog: bytes | memoryview) -> dict[str, Any]:
    """The catalog's header (not authenticated)."""
    return _header(_split(raw_catalog, _CAT_MAGIC, "catalog")[0], "catalog", {"store", "generation", "count"})


def keys_header(raw_keys: bytes | memoryview) -> dict[str, Any]:
    """The key table's header (not authenticated: for ids and messages)."""
    return _header(_split(raw_keys, _KEYS_MAGIC, "key table")[0], "key table", {"store", "generation", "kek"})


def check_kek(header: dict[str, Any], kek: Kek) -> None:
    """Raise :class:`StoreKeyError` (one line) unless ``kek`` seals the key table of ``header``."""
    if header["kek"] == kek.kek_id:
        return
    if kek.kek_id in header.get("retired", []):
        raise StoreKeyError(
            f"key {kek.kek_id} was retired by a key rotation and no longer opens this store; "
            f"use its current key (id {header['kek']})"
        )
    raise StoreKeyError(
        f"key {kek.kek_id} is not this store's key-encryption key (the store is sealed under key id {header['kek']}); "
        "pass the right --key-file or FEDSHARD_STORE_KEK"
    )


@dataclass
class Catalog:
    """A store's index, data keys and metadata, in memory (data keys in clear: keep it private)."""

    store_id: str
    kek_id: str
    generation: int = 0
    retired: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, CatalogEntry] = field(default_factory=dict)
    keys: dict[str, bytes] = field(default_factory=dict)

    # writing ---------------------------------------------------------------------------
    def _index(self) -> bytes:
        ids = list(self.entries)
        rows = list(self.entries.values())
        n = len(ids)
        arr = np.zeros(n, dtype=_ENTRY)
        if n:
            cols = list(zip(*rows, strict=True))
            arr["version"] = cols[0]
            arr["encoding"] = [ENCODINGS.index(e) for e in cols[1]]
            arr["digest"] = np.frombuffer(bytes.fromhex("".join(cols[2])), np.uint8).reshape(n, 32)
            arr["source"] = np.frombuffer(bytes.fromhex("".join(cols[3])), np.uint8).reshape(n, 32)
            for i, name in enumerate(("stored", "logical", "values", "written", "err_max", "err_sq", "ref_sq"), 4):
                arr[name] = cols[i]
        ids_json = json.dumps(ids, separators=(",", ":")).encode()
        return struct.pack("<I", len(ids_json)) + ids_json + arr.tobytes()

    def seal(self, kek: Kek) -> tuple[bytes, bytes]:
        """``(catalog, key table)`` bytes of this generation, the table sealed under ``kek``."""
        if self.keys.keys() != self.entries.keys():
            raise StoreError("internal error: the key table does not match the index")
        doc = {
            "format": _FORMAT,
            "store": self.store_id,
            "generation": self.generation,
            "count": len(self.entries),
            "meta": self.meta,
        }
        catalog = _assemble(_CAT_MAGIC, _canonical(doc), self._index())
        self.kek_id = kek.kek_id
        head = _canonical(
            {
                "format": _FORMAT,
                "store": self.store_id,
                "generation": self.generation,
                "count": len(self.entries),
                "catalog_sha256": hashlib.sha256(catalog).hexdigest(),
                "kek": self.kek_id,
                "retired": sorted(set(self.retired) - {self.kek_id}),
            }
        )
        table = b"".join(self.keys.values())
        return catalog, _assemble(_KEYS_MAGIC, head, seal_key_table(kek, table, _AAD_DOMAIN + head))

    # reading ---------------------------------------------------------------------------
    @classmethod
    def unseal(cls, raw_catalog: bytes, raw_keys: bytes, kek: Kek) -> Catalog:
        """Parse a catalog and its key table, and authenticate both with the KEK.

        Raises
        ------
        StoreKeyError
            ``kek`` is not (or no longer) the store's key.
        StoreError
            The catalog or key table is corrupt, altered, or they do not belong together.
        """
        raw_head, sealed = _split(raw_keys, _KEYS_MAGIC, "key table")
        head = _header(raw_head, "key table", {"store", "generation", "kek", "count", "catalog_sha256"})
        check_kek(head, kek)
        table = open_key_table(kek, sealed, _AAD_DOMAIN + raw_head)
        if hashlib.sha256(raw_catalog).hexdigest() != head["catalog_sha256"]:
            raise StoreError("the store's catalog was altered (it does not match its key table); restore it")
        catalog = cls.read_unauthenticated(raw_catalog)
        n = len(catalog.entries)
        if (head["store"], head["generation"], head["count"]) != (catalog.store_id, catalog.generation, n) or len(
            table
        ) != n * DATA_KEY_BYTES:
            raise StoreError("the store's key table does not match its catalog; restore them from a backup")
        catalog.kek_id = kek.kek_id
        catalog.retired = [str(k) for k in head.get("retired", [])]
        step = DATA_KEY_BYTES
        catalog.keys = {sid: table[i * step : (i + 1) * step] for i, sid in enumerate(catalog.entries)}
        return catalog

    @classmethod
    def read_unauthenticated(cls, raw_catalog: bytes) -> Catalog:
        """Parse a catalog without its key table: no data keys, nothing authenticated (for statistics)."""
        raw_head, index = _split(raw_catalog, _CAT_MAGIC, "catalog")
        doc = _header(raw_head, "catalog", {"store", "generation", "count"})
        try:
            (ids_len,) = struct.unpack_from("<I", index)
            ids = [str(sid) for sid in json.loads(bytes(index[4 : 4 + ids_len]))]
            arr = np.frombuffer(index, dtype=_ENTRY, offset=4 + ids_len, count=int(doc["count"]))
            if len(ids) != len(arr) or 4 + ids_len + arr.nbytes != len(index):
                raise ValueError("index size")
            digests, sources = arr["digest"].tobytes().hex(), arr["source"].tobytes().hex()
            n = len(ids)
            cols = [
                arr["version"].tolist(),
                [ENCODINGS[c] for c in arr["encoding"].tolist()],
                [digests[64 * i : 64 * i + 64] for i in range(n)],
                [sources[64 * i : 64 * i + 64] for i in range(n)],
                *(arr[name].tolist() for name in ("stored", "logical", "values", "written", "err_max", "err_sq")),
                arr["ref_sq"].tolist(),
            ]
            entries = dict(zip(ids, map(CatalogEntry._make, zip(*cols, strict=True)), strict=True))
            return cls(
                store_id=str(doc["store"]),
                kek_id="",
                generation=int(doc["generation"]),
                meta=dict(doc.get("meta", {})),
                entries=entries,
            )
        except (KeyError, TypeError, ValueError, IndexError, struct.error):
            raise StoreError("the store's catalog index is corrupt; restore the catalog from a backup") from None

    # rotation ---------------------------------------------------------------------------
    @staticmethod
    def rewrap(raw_keys: bytes, old: Kek, new: Kek) -> bytes:
        """The same key table re-sealed from ``old`` to ``new``, with ``old`` retired.

        One AES-GCM pass to open the table (32 bytes per shard) and one to seal it again;
        the catalog it belongs to (its SHA-256 is in the header) is neither read nor changed.
        """
        raw_head, sealed = _split(raw_keys, _KEYS_MAGIC, "key table")
        head = _header(raw_head, "key table", {"store", "generation", "kek", "count", "catalog_sha256"})
        check_kek(head, old)
        table = open_key_table(old, sealed, _AAD_DOMAIN + raw_head)
        head = dict(head)
        head["kek"] = new.kek_id
        head["retired"] = sorted({*head.get("retired", []), old.kek_id} - {new.kek_id})
        new_head = _canonical(head)
        return _assemble(_KEYS_MAGIC, new_head, seal_key_table(new, table, _AAD_DOMAIN + new_head))


def _assemble(magic: bytes, header: bytes, body: bytes) -> bytes:
    return b"".join([_PREFIX.pack(magic, len(header)), header, body])
