"""Round-level data shared by coordinator, sites and zones (metadata only)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fedshard.integrity.manifest import ShardEntry

__all__ = ["AggregateSummary", "PushReceipt", "RoundSpec", "derive_seed"]


@dataclass(frozen=True, slots=True)
class RoundSpec:
    """What a zone needs to accept pushes for one round.

    ``token`` is a fresh random value per round; a push must present it, so a push
    recorded in an earlier round cannot be replayed into this one.
    """

    round: int
    token: str
    plan_json: str
    base_version: str
    sites: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PushReceipt:
    """A zone's acknowledgement that a whole push was validated and counted."""

    zone: str
    round: int
    site_id: str
    shards: int
    bytes: int


@dataclass(frozen=True, slots=True)
class AggregateSummary:
    """What a zone published when it closed a round.

    ``shards`` lists the aggregate shards with their digests; ``merkle_root`` is the
    root over them, which feeds the model-version chain.
    """

    zone: str
    round: int
    merkle_root: str
    total_weight: float
    sites: tuple[str, ...]
    shards: tuple[ShardEntry, ...]


def derive_seed(*parts: object) -> int:
    """A 31-bit seed derived from ``parts`` (stable across processes and platforms)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
