"""One stored shard version: a small clear header and an AES-256-GCM ciphertext.

Layout of a blob::

    b"FSSHARD\\x01" | header length (uint32, little-endian) | header (JSON) | ciphertext ‖ tag

The header names the store, the shard, its version, its encoding (``full`` or a cold
format), dtype, shape and the nonce; the ciphertext holds the values (full precision)
or the cold payload (:mod:`fedshard.store.quantize`). The whole header, magic included,
is the GCM associated data, so it cannot be changed without the tag failing, and the
data key is the shard version's own. On read the header is compared with what the
catalog expects *before* decryption, so a swapped, rolled-back, foreign or truncated
file gets a message that says which, and anything else altered fails authentication.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedshard.crypto.at_rest import NONCE_BYTES, TAG_BYTES, open_envelope, seal_envelope
from fedshard.errors import ShardIntegrityError
from fedshard.integrity.canonical import canonical_json
from fedshard.store.quantize import ColdFormat, decode, encoded_nbytes

__all__ = ["BlobHeader", "decode_payload", "open_blob", "seal_blob"]

MAGIC = b"FSSHARD\x01"
_PREFIX = struct.Struct("<8sI")
_MAX_HEADER = 1 << 16
_NUMERIC_KINDS = "biufc"
FULL = "full"  # the encoding of a hot (full-precision) shard


@dataclass(frozen=True, slots=True)
class BlobHeader:
    """The clear (but authenticated) header of a shard blob."""

    store_id: str
    shard_id: str
    version: int
    encoding: str  # "full" or a ColdFormat value
    dtype: str
    shape: tuple[int, ...]
    nonce: bytes
    length: int  # ciphertext bytes, tag included

    def to_bytes(self) -> bytes:
        """Canonical JSON of the header."""
        doc = {
            "store": self.store_id,
            "shard": self.shard_id,
            "version": self.version,
            "encoding": self.encoding,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "nonce": self.nonce.hex(),
            "length": self.length,
        }
        return canonical_json(doc, allow_nan=True)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> BlobHeader:
        """Parse the header's JSON object (``KeyError``/``TypeError``/``ValueError`` if malformed)."""
        return cls(
            store_id=str(doc["store"]),
            shard_id=str(doc["shard"]),
            version=int(doc["version"]),
            encoding=str(doc["encoding"]),
            dtype=str(doc["dtype"]),
            shape=tuple(int(d) for d in doc["shape"]),
            nonce=bytes.fromhex(doc["nonce"]),
            length=int(doc["length"]),
        )


def seal_blob(header: BlobHeader, payload: bytes | memoryview, data_key: bytes) -> bytes:
    """The blob of ``payload`` under ``data_key``; ``header.length`` must be ``len(payload) + 16``."""
    head = header.to_bytes()
    prefix = _PREFIX.pack(MAGIC, len(head)) + head
    return prefix + seal_envelope(data_key, header.nonce, payload, prefix)


def open_blob(
    raw: bytes, data_key: bytes, *, store_id: str, shard_id: str, version: int, name: str
) -> tuple[BlobHeader, np.ndarray]:
    """Check and decrypt a blob; return its header and plaintext (a writable uint8 array).

    Raises
    ------
    ShardIntegrityError
        Truncated, not a shard blob, another store's, another shard's (swapped),
        another version (rolled back), or altered (authentication fails).
    """
    where = f"shard {shard_id}: stored file {name}"
    if len(raw) < _PREFIX.size:
        raise ShardIntegrityError(shard_id, f"{where} is truncated ({len(raw)} bytes); rewrite or restore the shard")
    magic, head_len = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise ShardIntegrityError(shard_id, f"{where} is not a shard blob (bad magic); rewrite or restore the shard")
    end = _PREFIX.size + head_len
    if head_len > _MAX_HEADER or end > len(raw):
        raise ShardIntegrityError(shard_id, f"{where} is truncated inside its header; rewrite or restore the shard")
    try:
        header = BlobHeader.from_doc(json.loads(raw[_PREFIX.size : end]))
    except (KeyError, TypeError, ValueError):
        raise ShardIntegrityError(shard_id, f"{where} has a corrupt header; rewrite or restore the shard") from None
    if header.store_id != store_id:
        raise ShardIntegrityError(shard_id, f"{where} belongs to another store ({header.store_id})")
    if header.shard_id != shard_id:
        raise ShardIntegrityError(shard_id, f"{where} holds shard {header.shard_id!r}: files were swapped")
    if header.version < version:
        raise ShardIntegrityError(
            shard_id, f"{where} holds version {header.version}, the catalog says {version}: rolled back to an old copy"
        )
    if header.version > version:
        raise ShardIntegrityError(
            shard_id, f"{where} holds version {header.version}, the catalog says {version}: the catalog is older"
        )
    body = len(raw) - end
    if body != header.length:
        state = "truncated" if body < header.length else "longer than written"
        raise ShardIntegrityError(shard_id, f"{where} is {state} ({body} of {header.length} bytes of ciphertext)")
    if len(header.nonce) != NONCE_BYTES or header.length < TAG_BYTES:
        raise ShardIntegrityError(shard_id, f"{where} has a corrupt header; rewrite or restore the shard")
    plain = np.empty(header.length - TAG_BYTES, dtype=np.uint8)
    view = memoryview(raw)
    if not open_envelope(data_key, header.nonce, view[end:], bytes(view[:end]), plain.data):
        raise ShardIntegrityError(
            shard_id, f"{where} failed authentication: its contents were altered (or it was not sealed under its key)"
        )
    return header, plain


def decode_payload(header: BlobHeader, plain: np.ndarray) -> np.ndarray:
    """The shard's values from an authenticated plaintext: as stored, or dequantised to the shard's dtype."""
    dtype = np.dtype(header.dtype)
    if dtype.kind not in _NUMERIC_KINDS:
        raise ShardIntegrityError(header.shard_id, f"shard {header.shard_id}: unsupported dtype {header.dtype!r}")
    count = math.prod(header.shape)
    if header.encoding == FULL:
        if plain.size != count * dtype.itemsize:
            raise ShardIntegrityError(header.shard_id, f"shard {header.shard_id}: size does not match its shape")
        return plain.view(dtype).reshape(header.shape)
    try:
        fmt = ColdFormat(header.encoding)
    except ValueError:
        raise ShardIntegrityError(
            header.shard_id, f"shard {header.shard_id}: unknown encoding {header.encoding!r}"
        ) from None
    if plain.size != encoded_nbytes(count, fmt):
        raise ShardIntegrityError(header.shard_id, f"shard {header.shard_id}: size does not match its shape")
    return decode(plain, fmt, count).astype(dtype, copy=False).reshape(header.shape)
