"""Shard digests: SHA-256 over dtype, shape and bytes.

The digest binds the interpretation of the bytes (dtype, shape) as well as the bytes,
so a shard cannot be reinterpreted (e.g. float32 read as int32) without detection.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = ["ShardHasher", "shard_digest"]

_DOMAIN = b"fedshard/shard/v1\x00"


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
