"""Integrity: shard digests, Merkle trees and proofs, manifests, the model-version chain."""

from fedshard.integrity.digest import (
    CIPHERTEXT_LABEL,
    HASH_NAME,
    ShardHasher,
    ciphertext_digest,
    ciphertext_hasher,
    shard_digest,
)
from fedshard.integrity.manifest import (
    MANIFEST_FORMAT,
    MAX_NOISE_TERMS,
    Manifest,
    ShardEntry,
    build_manifest,
    noise_terms_ok,
)
from fedshard.integrity.merkle import EMPTY_ROOT, InclusionProof, MerkleTree, merkle_root, verify_proof
from fedshard.integrity.version import genesis_version, next_version

__all__ = [
    "CIPHERTEXT_LABEL",
    "EMPTY_ROOT",
    "HASH_NAME",
    "MANIFEST_FORMAT",
    "MAX_NOISE_TERMS",
    "InclusionProof",
    "Manifest",
    "MerkleTree",
    "ShardEntry",
    "ShardHasher",
    "build_manifest",
    "ciphertext_digest",
    "ciphertext_hasher",
    "genesis_version",
    "merkle_root",
    "next_version",
    "noise_terms_ok",
    "shard_digest",
    "verify_proof",
]
