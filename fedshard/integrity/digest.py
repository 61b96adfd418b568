"""Shard digests: SHA-256 over dtype, shape and bytes.

The digest binds the interpretation of the bytes (dtype, shape) as well as the bytes,
so a shard cannot be reinterpreted (e.g. float32 read as int32) without detection.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = ["CIPHERTEXT_LABEL", "ShardHasher", "ciphertext_digest", "ciphertext_hasher", "shard_digest"]

_DOMAIN = b"fedshard/shard/v1\x00"

CIPHERTEXT_LABEL = "|u1"
"""The dtype label ciphertext bytes are hashed under, as a ``(1, n)`` array of bytes.

Stability contract: this is how encrypted shards were hashed when they travelled as
``(1, n)`` uint8 arrays, and it never changes, so the digests, Merkle roots and model
versions of encrypted runs (and the aggregates zones stored) keep their meaning now
that ciphertexts are ``bytes``."""


class ShardHasher:
    """Incremental shard digest, for shards that arrive in chunks.

    Parameters
    ----------
    dtype:
        NumPy dtype string (little-endian, e.g. ``"<f4"``).
    shape:
        Shape of the shard.
    """

    def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
        self._hash = hashlib.sha256(_DOMAIN)
        header = f"{np.dtype(dtype).str}|{','.join(str(int(d)) for d in shape)}\x00"
        self._hash.update(header.encode())

    def update(self, data: Any) -> None:
        """Feed the next bytes of the shard (any buffer)."""
        self._hash.update(data)

    def hexdigest(self) -> str:
        """Return the digest as lowercase hex."""
        return self._hash.hexdigest()


def shard_digest(array: np.ndarray) -> str:
    """Digest of one shard array (hex SHA-256 over dtype, shape and little-endian bytes)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    hasher = ShardHasher(array.dtype.str, array.shape)
    # A flat uint8 view, not memoryview.cast: cast refuses arrays with a zero in their shape.
    hasher.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return hasher.hexdigest()


def ciphertext_hasher(nbytes: int) -> ShardHasher:
    """Incremental digest of ``nbytes`` bytes of ciphertext (see :data:`CIPHERTEXT_LABEL`)."""
    return ShardHasher(CIPHERTEXT_LABEL, (1, nbytes))


def ciphertext_digest(data: bytes | bytearray | memoryview) -> str:
    """Digest of one encrypted shard's ciphertext bytes (see :data:`CIPHERTEXT_LABEL`)."""
    view = memoryview(data).cast("B")
    hasher = ciphertext_hasher(len(view))
    hasher.update(view)
    return hasher.hexdigest()
