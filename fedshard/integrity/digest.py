"""Shard digests: BLAKE3 over a domain prefix, dtype, shape and bytes.

The digest binds the interpretation of the bytes (dtype, shape) as well as the bytes,
so a shard cannot be reinterpreted (e.g. float32 read as int32) without detection.

Every digest of the integrity package (shard digests, Merkle leaves and nodes, the
model-version chain) uses one hash, :data:`HASH_NAME`, and manifests name it
(:mod:`fedshard.integrity.manifest`). It was SHA-256 up to manifest format 2; BLAKE3
since format 3, for speed: every byte of every update is digested at the site, at the
zone and again by every site that fetches the aggregate. The inputs did not change, so
the same update has new digests, Merkle roots and model versions and nothing else.
Hashing is single-threaded (on two busy cores BLAKE3's threads were slower), and reads
arrays through the buffer protocol, without copying them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from blake3 import blake3

__all__ = [
    "CIPHERTEXT_LABEL",
    "HASH_NAME",
    "ShardHasher",
    "ciphertext_digest",
    "ciphertext_hasher",
    "shard_digest",
]

HASH_NAME = "blake3"
"""The hash of every shard digest, Merkle node and model version, as manifests name it."""

_DOMAIN = b"fedshard/shard/v1\x00"

CIPHERTEXT_LABEL = "|u1"
"""The dtype label ciphertext bytes are hashed under, as a ``(1, n)`` array of bytes.

Stability contract: this is how encrypted shards were hashed when they travelled as
``(1, n)`` uint8 arrays, and it never changes, so ciphertext digests keep the same
input now that ciphertexts are ``bytes`` (only :data:`HASH_NAME` moved them)."""


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
        header = f"{np.dtype(dtype).str}|{','.join(str(int(d)) for d in shape)}\x00"
        self._hash = blake3(_DOMAIN + header.encode())

    def update(self, data: Any) -> None:
        """Feed the next bytes of the shard (any C-contiguous buffer; read in place, not copied)."""
        try:
            self._hash.update(data)
        except BufferError:  # BLAKE3 takes byte buffers only: view others (a float array) as bytes
            self._hash.update(np.frombuffer(data, dtype=np.uint8).data)

    def hexdigest(self) -> str:
        """Return the digest as lowercase hex."""
        return self._hash.hexdigest()


def shard_digest(array: np.ndarray) -> str:
    """Digest of one shard array (hex BLAKE3 over domain, dtype, shape and little-endian bytes).

    A C-contiguous little-endian array is hashed in place; others are made so first
    (the one copy the digest's definition needs).
    """
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    hasher = ShardHasher(array.dtype.str, array.shape)
    # A flat uint8 view, not memoryview.cast: cast refuses arrays with a zero in their shape.
    hasher.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return hasher.hexdigest()


def ciphertext_hasher(nbytes: int) -> ShardHasher:
    """Incremental digest of ``nbytes`` bytes of ciphertext (see :data:`CIPHERTEXT_LABEL`)."""
    return ShardHasher(CIPHERTEXT_LABEL, (1, nbytes))


def ciphertext_digest(data: bytes | bytearray | memoryview) -> str:
    """Digest of one encrypted shard's ciphertext bytes (see :data:`CIPHERTEXT_LABEL`)."""
    hasher = ciphertext_hasher(memoryview(data).nbytes)
    hasher.update(data)
    return hasher.hexdigest()
