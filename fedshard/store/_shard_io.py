"""One shard of the sealed store, in and out: where its blob lives, how it is sealed, how a read is checked.

Write path: :func:`normalise` the array, then :func:`seal_shard` it under a fresh data
key into the blob of its next version, with the catalog entry that will name it. Read
path: :func:`read_shard` opens the blob the catalog names and checks, in order, that it
exists and is whole, that it is this store's, this shard's and this version's (swap and
rollback), the AES-GCM tag (any other change), the encoding, then the BLAKE3 shard
digest the catalog records. The commit that makes a write visible is
:mod:`fedshard.store._commit`'s.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedshard.crypto.at_rest import NONCE_BYTES, TAG_BYTES, new_data_key
from fedshard.errors import ShardIntegrityError, StoreError
from fedshard.integrity.digest import shard_digest
from fedshard.store._backend import Backend
from fedshard.store._shard_blob import FULL, BlobHeader, decode_payload, open_blob, seal_blob
from fedshard.store.catalog import CatalogEntry
from fedshard.store.quantize import ColdFormat, decode, decode_into, encode

__all__ = ["BLOBS", "ColdCodes", "SealedShard", "blob_name", "normalise", "read_codes", "read_shard", "seal_shard"]

BLOBS = "blobs/"
"""Prefix of every shard blob's name on the backend."""

_NUMERIC_KINDS = "biufc"


def blob_name(shard_id: str, version: int) -> str:
    """The backend name of version ``version`` of ``shard_id``."""
    h = hashlib.sha256(shard_id.encode()).hexdigest()[:32]
    return f"{BLOBS}{h[:2]}/{h}.v{version}"


def normalise(shard_id: str, array: Any) -> np.ndarray:
    """``array`` as a C-contiguous little-endian numeric array, after checking ``shard_id``.

    Raises
    ------
    StoreError
        If the id is empty, too long or holds a NUL, or the array is not numeric.
    """
    if not isinstance(shard_id, str) or not shard_id or len(shard_id) > 1024 or "\x00" in shard_id:
        raise StoreError(f"invalid shard id {shard_id!r}: a non-empty string of at most 1024 characters")
    values = np.asarray(array)
    if values.dtype.kind not in _NUMERIC_KINDS:
        raise StoreError(f"shard {shard_id}: cannot store dtype {values.dtype}; shards are numeric arrays")
    if values.dtype.byteorder == ">":
        values = values.astype(values.dtype.newbyteorder("<"))
    return values if values.flags.c_contiguous else values.copy(order="C")


@dataclass(frozen=True, slots=True)
class SealedShard:
    """A shard version sealed and ready to write: its blob, the entry and data key the catalog will hold."""

    name: str
    blob: bytes
    entry: CatalogEntry
    data_key: bytes


def seal_shard(
    store_id: str,
    shard_id: str,
    version: int,
    values: np.ndarray,
    fmt: ColdFormat | None,
    source_digest: str | None,
    written_at: float,
) -> SealedShard:
    """Seal ``values`` (normalised) as version ``version`` of ``shard_id`` under a fresh data key.

    Parameters
    ----------
    fmt:
        ``None`` for full precision (hot); a cold format quantises the values and records
        the error it introduced.
    source_digest:
        Digest of the full-precision values the shard came from (default: the digest of
        what a read will return).
    written_at:
        The write time the catalog records.
    """
    data_key, nonce = new_data_key(), os.urandom(NONCE_BYTES)
    err_max = err_sq = ref_sq = 0.0
    if fmt is None:
        payload: bytes | memoryview = values.reshape(-1).view(np.uint8).data
        digest = shard_digest(values)
    else:
        payload = encode(values, fmt)
        decoded = decode(payload, fmt, values.size).astype(values.dtype, copy=False).reshape(values.shape)
        diff = decoded.astype(np.float64) - values
        err_max = float(np.abs(diff).max()) if diff.size else 0.0
        err_sq = float(np.dot(diff.reshape(-1), diff.reshape(-1)))
        flat = values.reshape(-1).astype(np.float64)
        ref_sq = float(np.dot(flat, flat))
        digest = shard_digest(decoded)
    header = BlobHeader(
        store_id=store_id,
        shard_id=shard_id,
        version=version,
        encoding=FULL if fmt is None else fmt.value,
        dtype=values.dtype.str,
        shape=tuple(int(d) for d in values.shape),
        nonce=nonce,
        length=len(payload) + TAG_BYTES,
    )
    blob = seal_blob(header, payload, data_key)
    entry = CatalogEntry(
        version=version,
        encoding=header.encoding,
        digest=digest,
        source_digest=source_digest or digest,
        stored_bytes=len(blob),
        logical_bytes=int(values.nbytes),
        values=int(values.size),
        written_at=written_at,
        err_max=err_max,
        err_sq=err_sq,
        ref_sq=ref_sq,
    )
    return SealedShard(blob_name(shard_id, version), blob, entry, data_key)


def read_shard(
    backend: Backend,
    store_id: str,
    shard_id: str,
    entry: CatalogEntry,
    data_key: bytes,
    *,
    check_digest: bool = True,
) -> np.ndarray:
    """The verified values of the version of ``shard_id`` that ``entry`` names (see the module docstring).

    ``check_digest=False`` skips only the last check, the BLAKE3 digest of the values; for
    a caller that has already checked it for this very blob (the AES-GCM tag proves the
    plaintext is the one sealed, so a digest that matched once matches again).

    Raises
    ------
    ShardIntegrityError
        If its blob is missing, truncated, swapped, rolled back or altered, or its values
        do not match the catalog's digest.
    """
    return _read(backend, store_id, shard_id, entry, data_key, check_digest)[2]


def _read(
    backend: Backend, store_id: str, shard_id: str, entry: CatalogEntry, data_key: bytes, check_digest: bool
) -> tuple[BlobHeader, np.ndarray, np.ndarray]:
    """(header, authenticated plaintext, values) of the version ``entry`` names, every check of
    :func:`read_shard` made (the digest's only if ``check_digest``)."""
    name = blob_name(shard_id, entry.version)
    raw = backend.read(name)
    if raw is None:
        raise ShardIntegrityError(shard_id, f"shard {shard_id}: its stored file {name} is missing")
    header, plain = open_blob(raw, data_key, store_id=store_id, shard_id=shard_id, version=entry.version, name=name)
    if header.encoding != entry.encoding:
        raise ShardIntegrityError(
            shard_id, f"shard {shard_id}: stored as {header.encoding}, the catalog says {entry.encoding}"
        )
    values = decode_payload(header, plain)
    if check_digest and shard_digest(values) != entry.digest:
        raise ShardIntegrityError(shard_id, f"shard {shard_id}: its values do not match the catalog's digest")
    return header, plain, values


@dataclass(frozen=True, slots=True)
class ColdCodes:
    """A cold shard's authenticated plaintext, kept to be dequantised again and again: its format,
    its shape and the encoded payload (scales and codes, about a quarter of float32 for int8)."""

    format: ColdFormat
    shape: tuple[int, ...]
    payload: np.ndarray

    def decode_into(self, out: np.ndarray) -> None:
        """Dequantise into ``out`` (float32 of :attr:`shape`, a strided view allowed)."""
        decode_into(self.payload, self.format, out)


def read_codes(backend: Backend, store_id: str, shard_id: str, entry: CatalogEntry, data_key: bytes) -> ColdCodes:
    """The cold shard ``shard_id`` as :class:`ColdCodes`, after every check of :func:`read_shard`
    (its values are decoded once, for the BLAKE3 digest).

    Raises
    ------
    ShardIntegrityError
        As :func:`read_shard`; or the shard is not cold (``full`` or not float32).
    """
    header, plain, values = _read(backend, store_id, shard_id, entry, data_key, True)
    if header.encoding == FULL or values.dtype != np.float32:
        raise ShardIntegrityError(shard_id, f"shard {shard_id} is stored {header.encoding} {header.dtype}, not cold")
    return ColdCodes(ColdFormat(header.encoding), tuple(header.shape), plain)
