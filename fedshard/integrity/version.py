"""The model-version hash chain.

``v_0 = H("fedshard/genesis" ‖ plan digest ‖ root of the initial parameters)`` and
``v_r = H(v_{r-1} ‖ merkle_root(aggregate_r))``. Every site can recompute the chain
from the aggregates it applied, so sites that disagree on the model notice.

``H`` is BLAKE3, the hash of the shard digests and Merkle nodes
(:data:`fedshard.integrity.digest.HASH_NAME`), so one name in a manifest says how
every hash it carries or refers to was made. (The plan digest is not part of this
family: it is the SHA-256 of the plan's JSON, :attr:`fedshard.sharding.ShardPlan.digest`.)
"""

from __future__ import annotations

from fedshard.integrity.chain import ChainHash, chain_link

__all__ = ["genesis_version", "next_version"]

_GENESIS = b"fedshard/genesis\x00"


def genesis_version(plan_digest: str, initial_root: str) -> str:
    """Version 0: binds the shard plan and the initial parameters."""
    link = chain_link(bytes.fromhex(plan_digest), bytes.fromhex(initial_root), ChainHash.BLAKE3, domain=_GENESIS)
    return link.hex()


def next_version(previous: str, aggregate_root: str) -> str:
    """``v_r = H(v_{r-1} ‖ root_r)`` (hex in, hex out)."""
    return chain_link(bytes.fromhex(previous), bytes.fromhex(aggregate_root), ChainHash.BLAKE3).hex()
