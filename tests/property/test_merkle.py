"""Property tests of the Merkle tree: proofs verify exactly for the unchanged leaf.

The reference functions below restate RFC 6962 section 2.1 recursively, independent
of the bit arithmetic :func:`verify_proof` uses (RFC 9162 section 2.1.3.2).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import pytest
from blake3 import blake3
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedshard.errors import IntegrityError
from fedshard.integrity import EMPTY_ROOT, InclusionProof, MerkleTree, merkle_root, verify_proof

hex_digests = st.binary(min_size=32, max_size=32).map(bytes.hex)
shard_ids = st.text(min_size=1, max_size=12)
leaf_sets = st.dictionaries(shard_ids, hex_digests, min_size=1, max_size=60)


def _split(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def reference_root(leaves: list[tuple[str, str]]) -> str:
    """RFC 6962 Merkle tree hash over leaves already in tree order."""

    def mth(items: list[tuple[str, str]]) -> bytes:
        if len(items) == 1:
            shard_id, digest = items[0]
            return blake3(b"\x00" + shard_id.encode() + b"\x00" + digest.encode()).digest()
        k = _split(len(items))
        return blake3(b"\x01" + mth(items[:k]) + mth(items[k:])).digest()

    return mth(leaves).hex()


def turns(index: int, size: int) -> tuple[str, ...] | None:
    """Which side the node is on at each level, leaf upwards; None if ``index`` is not a leaf.

    Two (index, size) pairs with the same turns hash a leaf and a path identically.
    """
    if not 0 <= index < size:
        return None
    out: list[str] = []
    while size > 1:
        k = _split(size)
        if index < k:
            out.append("left")
            size = k
        else:
            out.append("right")
            index, size = index - k, size - k
    return tuple(reversed(out))


@settings(max_examples=100, deadline=None)
@given(leaves=leaf_sets)
def test_every_leaf_proof_verifies_against_the_root(leaves: dict[str, str]) -> None:
    tree = MerkleTree(leaves)
    ordered = sorted(leaves.items())

    assert tree.root == merkle_root(leaves) == reference_root(ordered)
    assert len(tree) == len(leaves)
    for index, (shard_id, digest) in enumerate(ordered):
        proof = tree.prove(shard_id)
        assert (proof.shard_id, proof.digest, proof.index, proof.size) == (shard_id, digest, index, len(leaves))
        assert verify_proof(proof, tree.root)


MUTATIONS = ["digest", "shard_id", "index", "size", "path-element", "path-drop", "path-extra", "root"]


@settings(max_examples=200, deadline=None)
@given(leaves=leaf_sets, data=st.data(), mutation=st.sampled_from(MUTATIONS))
def test_a_changed_proof_does_not_verify(leaves: dict[str, str], data: st.DataObject, mutation: str) -> None:
    tree = MerkleTree(leaves)
    proof = tree.prove(data.draw(st.sampled_from(sorted(leaves)), label="leaf"))
    root = tree.root
    expect = False

    if mutation == "digest":
        new = data.draw(hex_digests.filter(lambda d: d != proof.digest), label="digest")
        proof = replace(proof, digest=new)
    elif mutation == "shard_id":
        new = data.draw(shard_ids.filter(lambda s: s != proof.shard_id), label="shard_id")
        proof = replace(proof, shard_id=new)
    elif mutation == "index":
        new = data.draw(st.integers(-3, proof.size + 3).filter(lambda i: i != proof.index), label="index")
        proof = replace(proof, index=new)
    elif mutation == "size":
        new = data.draw(st.integers(-1, 2 * proof.size + 2).filter(lambda n: n != proof.size), label="size")
        # The root does not commit to the number of leaves (RFC 9162 takes the size from
        # the signed tree head), so a size whose tree puts this leaf at the same place
        # in the same shape of path (e.g. index 0 of 3 and of 4) still verifies; any
        # other size must not.
        expect = turns(proof.index, new) == turns(proof.index, proof.size)
        proof = replace(proof, size=new)
    elif mutation == "path-element":
        assume(proof.path)
        at = data.draw(st.integers(0, len(proof.path) - 1), label="at")
        new = data.draw(hex_digests.filter(lambda h: h != proof.path[at]), label="element")
        proof = replace(proof, path=(*proof.path[:at], new, *proof.path[at + 1 :]))
    elif mutation == "path-drop":
        assume(proof.path)
        at = data.draw(st.integers(0, len(proof.path) - 1), label="at")
        proof = replace(proof, path=proof.path[:at] + proof.path[at + 1 :])
    elif mutation == "path-extra":
        at = data.draw(st.integers(0, len(proof.path)), label="at")
        extra = data.draw(hex_digests, label="element")
        proof = replace(proof, path=(*proof.path[:at], extra, *proof.path[at:]))
    else:
        root = data.draw(hex_digests.filter(lambda r: r != root), label="root")

    assert verify_proof(proof, root) is expect


def test_size_change_that_moves_the_leaf_is_caught() -> None:
    leaves = {f"s{i}": hashlib.sha256(bytes([i])).hexdigest() for i in range(5)}
    tree = MerkleTree(leaves)
    proof = tree.prove("s4")  # the lone right subtree of a 5-leaf tree

    assert verify_proof(proof, tree.root)
    for size in (6, 7, 8, 9):
        assert not verify_proof(replace(proof, size=size), tree.root)


def test_root_does_not_depend_on_insertion_order() -> None:
    items = [(f"layer{i}.weight#r0c{i % 3}", hashlib.sha256(str(i).encode()).hexdigest()) for i in range(17)]
    shuffled = items[:]
    random.Random(7).shuffle(shuffled)

    assert merkle_root(dict(items)) == merkle_root(dict(shuffled)) == merkle_root(dict(reversed(items)))


def test_root_changes_with_any_leaf() -> None:
    leaves = {f"s{i}": hashlib.sha256(bytes([i])).hexdigest() for i in range(6)}
    root = merkle_root(leaves)

    assert merkle_root({**leaves, "s3": hashlib.sha256(b"x").hexdigest()}) != root
    assert merkle_root({k: v for k, v in leaves.items() if k != "s5"}) != root
    assert merkle_root({**leaves, "s6": hashlib.sha256(b"y").hexdigest()}) != root


def test_empty_tree_root_is_empty_root() -> None:
    assert blake3(b"").hexdigest() == EMPTY_ROOT
    assert merkle_root({}) == EMPTY_ROOT
    assert MerkleTree({}).root == EMPTY_ROOT
    assert len(MerkleTree({})) == 0


def test_single_leaf_root_is_the_leaf_hash_and_path_is_empty() -> None:
    digest = hashlib.sha256(b"only").hexdigest()
    tree = MerkleTree({"w#r0c0": digest})

    proof = tree.prove("w#r0c0")

    assert tree.root == blake3(b"\x00w#r0c0\x00" + digest.encode()).hexdigest()
    assert proof == InclusionProof("w#r0c0", digest, 0, 1, ())
    assert verify_proof(proof, tree.root)


def test_prove_unknown_shard_raises_integrity_error() -> None:
    tree = MerkleTree({"a": hashlib.sha256(b"a").hexdigest()})

    with pytest.raises(IntegrityError, match="'b' is not in this Merkle tree"):
        tree.prove("b")


def test_non_hex_path_does_not_verify() -> None:
    leaves = {f"s{i}": hashlib.sha256(bytes([i])).hexdigest() for i in range(4)}
    tree = MerkleTree(leaves)
    proof = tree.prove("s1")

    assert not verify_proof(replace(proof, path=("zz", *proof.path[1:])), tree.root)


@settings(max_examples=100, deadline=None)
@given(leaves=leaf_sets, data=st.data())
def test_a_trusted_size_binds_the_claimed_size(leaves: dict[str, str], data: st.DataObject) -> None:
    tree = MerkleTree(leaves)
    proof = tree.prove(data.draw(st.sampled_from(sorted(leaves))))
    assert verify_proof(proof, tree.root, size=len(leaves))
    other = data.draw(st.integers(1, 2 * len(leaves) + 2).filter(lambda n: n != len(leaves)))
    assert not verify_proof(replace(proof, size=other), tree.root, size=len(leaves))
