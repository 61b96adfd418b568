"""The :class:`ShardStore` protocol: what a site's on-prem shard store offers.

A shard store keeps shard arrays under stable shard ids (``layer.weight#r0c1``),
each with a version that grows with every write, plus a little JSON metadata (the
model version, the shard plan). Reads return exactly what the store vouches for or
raise :class:`~fedshard.errors.ShardIntegrityError`; writes are atomic.

:class:`~fedshard.store.sealed_store.SealedShardStore` implements it on any
:class:`~fedshard.store._backend.Backend` (a local folder by default, or fsspec).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["ShardStat", "ShardStore", "Tier"]


class Tier(StrEnum):
    """Where a shard is kept: at full precision (hot) or in a low-precision format (cold)."""

    HOT = "hot"
    COLD = "cold"


@dataclass(frozen=True, slots=True)
class ShardStat:
    """What the store records of one shard.

    ``digest`` is the digest of what a read returns (for a cold shard, its dequantised
    values); ``source_digest`` that of the full-precision values it was written with,
    which the model's Merkle root covers.
    """

    shard_id: str
    version: int
    tier: Tier
    encoding: str  # "full", or the cold format ("fp8", "int8", "int4")
    digest: str
    source_digest: str
    stored_bytes: int
    logical_bytes: int
    written_at: float
    last_access: float


@runtime_checkable
class ShardStore(Protocol):
    """Put, get, delete, list and stat shards; read and write small metadata.

    Runtime-checkable: ``isinstance(x, ShardStore)`` tells whether ``x`` has every method
    (not whether their signatures match; the contract tests check those).
    """

    def put(self, shard_id: str, array: np.ndarray) -> ShardStat:
        """Store ``array`` as the next version of ``shard_id`` (hot, full precision), atomically."""
        ...

    def put_many(self, shards: Mapping[str, np.ndarray]) -> list[ShardStat]:
        """Store several shards in one atomic commit."""
        ...

    def get(self, shard_id: str, *, touch: bool = True) -> np.ndarray:
        """The shard's values, verified; ``touch`` records the read as an access."""
        ...

    def delete(self, shard_id: str) -> None:
        """Remove a shard."""
        ...

    def list(self) -> list[str]:
        """Ids of the stored shards, sorted."""
        ...

    def stat(self, shard_id: str) -> ShardStat:
        """What the store records of ``shard_id``."""
        ...

    def get_meta(self, key: str, default: Any = None) -> Any:
        """A metadata value (JSON), or ``default``."""
        ...

    def set_meta(self, key: str, value: Any) -> None:
        """Set a metadata value (JSON-serialisable), atomically."""
        ...
