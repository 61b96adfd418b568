"""Merkle trees over shard digests, with inclusion proofs.

The tree follows RFC 6962 (Certificate Transparency): leaves are
``H(0x00 ‖ data)``, interior nodes ``H(0x01 ‖ left ‖ right)``, and a tree of n
leaves splits at the largest power of two below n. ``H`` is BLAKE3 (32 bytes), the
hash of the shard digests (:data:`fedshard.integrity.digest.HASH_NAME`). Leaf data is
``shard_id ‖ 0x00 ‖ digest`` and leaves are sorted by shard id, so the root of a set
of shards does not depend on the order they were produced in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from blake3 import blake3

from fedshard.errors import IntegrityError

__all__ = ["EMPTY_ROOT", "InclusionProof", "MerkleTree", "merkle_root", "verify_proof"]

EMPTY_ROOT: str = blake3(b"").hexdigest()
"""The root of a tree of no leaves: ``H("")``."""


def _leaf_hash(shard_id: str, digest: str) -> bytes:
    return blake3(b"\x00" + shard_id.encode() + b"\x00" + digest.encode()).digest()


def _node_hash(left: bytes, right: bytes) -> bytes:
    return blake3(b"\x01" + left + right).digest()


def _split_point(n: int) -> int:
    """Largest power of two strictly smaller than n (n >= 2)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def _root(leaves: list[bytes], lo: int = 0, hi: int | None = None) -> bytes:
    """Root of ``leaves[lo:hi]`` (indices, not slices: no copies of the leaf list)."""
    hi = len(leaves) if hi is None else hi
    if hi - lo == 1:
        return leaves[lo]
    mid = lo + _split_point(hi - lo)
    return _node_hash(_root(leaves, lo, mid), _root(leaves, mid, hi))


def _path(leaves: list[bytes], index: int) -> list[bytes]:
    """Audit path (siblings from the leaf upwards) for leaf ``index``."""
    path: list[bytes] = []
    lo, hi = 0, len(leaves)
    while hi - lo > 1:
        mid = lo + _split_point(hi - lo)
        if index < mid:
            path.append(_root(leaves, mid, hi))
            hi = mid
        else:
            path.append(_root(leaves, lo, mid))
            lo = mid
    path.reverse()  # from the leaf upwards
    return path


@dataclass(frozen=True, slots=True)
class InclusionProof:
    """Proof that ``(shard_id, digest)`` is leaf ``index`` of a tree of ``size`` leaves."""

    shard_id: str
    digest: str
    index: int
    size: int
    path: tuple[str, ...]  # sibling hashes, hex, from the leaf upwards


class MerkleTree:
    """Merkle tree over ``{shard_id: digest}``.

    Parameters
    ----------
    digests:
        Shard digests (hex) by shard id.
    """

    def __init__(self, digests: Mapping[str, str]) -> None:
        self._ids = sorted(digests)
        self._digests = dict(digests)
        self._index = {sid: i for i, sid in enumerate(self._ids)}
        self._leaves = [_leaf_hash(sid, self._digests[sid]) for sid in self._ids]
        self.root: str = _root(self._leaves).hex() if self._leaves else EMPTY_ROOT

    def __len__(self) -> int:
        return len(self._ids)

    def prove(self, shard_id: str) -> InclusionProof:
        """Return the inclusion proof of ``shard_id``."""
        if shard_id not in self._index:
            raise IntegrityError(f"shard {shard_id!r} is not in this Merkle tree")
        index = self._index[shard_id]
        path = tuple(h.hex() for h in _path(self._leaves, index))
        return InclusionProof(shard_id, self._digests[shard_id], index, len(self._leaves), path)


def merkle_root(digests: Mapping[str, str]) -> str:
    """Root (hex) of the Merkle tree over ``{shard_id: digest}``."""
    return MerkleTree(digests).root


def verify_proof(proof: InclusionProof, root: str, size: int | None = None) -> bool:
    """Return True if ``proof`` shows its leaf is in the tree with ``root``.

    Implements RFC 9162 section 2.1.3.2 (verifying an inclusion proof). The root does
    not commit to the number of leaves, so pass ``size`` from a trusted source (the
    manifest's shard count) to bind the proof's claimed position as well.
    """
    if size is not None and proof.size != size:
        return False
    if not 0 <= proof.index < proof.size:
        return False
    try:
        path = [bytes.fromhex(h) for h in proof.path]
    except ValueError:
        return False
    fn, sn = proof.index, proof.size - 1
    node = _leaf_hash(proof.shard_id, proof.digest)
    for sibling in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            node = _node_hash(sibling, node)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            node = _node_hash(node, sibling)
        fn >>= 1
        sn >>= 1
    return sn == 0 and node.hex() == root
