"""Unit tests of shard digests, manifests and the model-version chain."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from blake3 import blake3

from fedshard.errors import IntegrityError, RefusalCode
from fedshard.integrity import (
    HASH_NAME,
    MANIFEST_FORMAT,
    MAX_NOISE_TERMS,
    Manifest,
    ShardEntry,
    ShardHasher,
    build_manifest,
    ciphertext_digest,
    genesis_version,
    merkle_root,
    next_version,
    shard_digest,
)
from fedshard.protocol.codes import refusal_code
from fedshard.protocol.rounds import PartialEntry, PartialSum

PLAN_DIGEST = hashlib.sha256(b"plan").hexdigest()
BASE_VERSION = hashlib.sha256(b"v0").hexdigest()


def _shards() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "fc.weight#r0c0": rng.standard_normal((4, 4)).astype(np.float32),
        "fc.weight#r0c1": rng.standard_normal((4, 2)).astype(np.float32),
        "fc.bias#r0c0": rng.standard_normal((4, 1)).astype(np.float32),
    }


def _manifest(**overrides: object) -> Manifest:
    fields: dict[str, object] = {
        "site_id": "site-a",
        "round": 3,
        "plan_digest": PLAN_DIGEST,
        "base_version": BASE_VERSION,
        "zone": "eu-1",
        "weight": 120.0,
        "shards": _shards(),
    }
    fields.update(overrides)
    return build_manifest(**fields)  # type: ignore[arg-type]


def _edited(manifest: Manifest, **changes: object) -> bytes:
    body = json.loads(manifest.to_bytes())
    body.update(changes)
    return json.dumps(body).encode()


# shard digests ----------------------------------------------------------------------------


def test_digest_is_blake3_of_domain_dtype_shape_and_bytes() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)

    expected = blake3(b"fedshard/shard/v1\x00" + b"<f4|2,3\x00" + array.tobytes()).hexdigest()

    assert HASH_NAME == "blake3"
    assert shard_digest(array) == expected
    # a known answer, independent of any library: the digest of this shard never changes meaning
    assert expected == "1b3103516ee980f7a8b0e640345b97ccd239f84c45e267847c0f19b13e33c7c4"


def test_ciphertext_digest_is_blake3_of_its_bytes_as_a_row_of_u1() -> None:
    data = bytes(range(7))

    assert ciphertext_digest(data) == blake3(b"fedshard/shard/v1\x00|u1|1,7\x00" + data).hexdigest()
    assert ciphertext_digest(memoryview(bytearray(data))) == ciphertext_digest(data)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],  # not contiguous
        np.arange(12, dtype=">f4").reshape(3, 4),  # big-endian
        np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        np.zeros((0, 3), dtype=np.float32),
    ],
)
def test_digest_of_any_layout_is_that_of_its_contiguous_little_endian_copy(array: np.ndarray) -> None:
    copy = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))

    expected = blake3(f"fedshard/shard/v1\x00{copy.dtype.str}|{','.join(map(str, copy.shape))}\x00".encode())
    assert shard_digest(array) == expected.update(copy.tobytes()).hexdigest()


def test_hasher_takes_typed_buffers_as_their_bytes() -> None:
    array = np.arange(6, dtype=np.float32)
    hasher = ShardHasher("<f4", (6,))
    hasher.update(memoryview(array))  # a typed buffer: hashed as its bytes, not refused

    assert hasher.hexdigest() == shard_digest(array)


def test_digest_covers_dtype() -> None:
    array = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)

    reinterpreted = array.view(np.int32)

    assert reinterpreted.tobytes() == array.tobytes()
    assert shard_digest(reinterpreted) != shard_digest(array)
    assert shard_digest(array.view(np.float16)) != shard_digest(array)


@pytest.mark.parametrize("shape", [(16,), (2, 8), (8, 2), (16, 1), (1, 16), (2, 2, 4)])
def test_digest_covers_shape(shape: tuple[int, ...]) -> None:
    array = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)

    assert shard_digest(array.reshape(shape)) != shard_digest(array)


def test_digest_changes_with_one_value() -> None:
    array = np.zeros((4, 4), dtype=np.float64)
    changed = array.copy()
    changed[3, 3] = np.nextafter(0.0, 1.0)

    assert shard_digest(changed) != shard_digest(array)


@pytest.mark.parametrize("dtype", ["f2", "f4", "f8"])
def test_big_endian_digest_equals_little_endian(dtype: str) -> None:
    little = np.linspace(-3, 3, 12).astype(f"<{dtype}").reshape(3, 4)
    big = little.astype(f">{dtype}")

    assert big.tobytes() != little.tobytes()
    assert shard_digest(big) == shard_digest(little)


def test_non_contiguous_digest_equals_contiguous_copy() -> None:
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    view = base[::2, 1::3]

    assert not view.flags.c_contiguous
    assert shard_digest(view) == shard_digest(np.ascontiguousarray(view))


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 10_000])
def test_incremental_hasher_equals_one_shot(chunk: int) -> None:
    array = np.random.default_rng(0).standard_normal((17, 9)).astype(np.float32)
    raw = array.tobytes()

    hasher = ShardHasher("<f4", array.shape)
    for start in range(0, len(raw), chunk):
        hasher.update(raw[start : start + chunk])

    assert hasher.hexdigest() == shard_digest(array)


def test_hasher_normalises_the_dtype_spelling() -> None:
    array = np.ones((2, 2), dtype=np.float32)

    for spelling in ("<f4", "float32", "f4"):
        hasher = ShardHasher(spelling, (2, 2))
        hasher.update(array.tobytes())
        assert hasher.hexdigest() == shard_digest(array)


# manifests --------------------------------------------------------------------------------


def test_build_manifest_lists_digests_sizes_and_root() -> None:
    shards = _shards()

    manifest = _manifest(shards=shards)

    assert [e.shard_id for e in manifest.shards] == list(shards)
    for sid, array in shards.items():
        assert manifest.entry(sid) == ShardEntry(sid, shard_digest(array), array.nbytes)
    assert manifest.entry("nope") is None
    assert manifest.total_bytes == sum(a.nbytes for a in shards.values())
    assert manifest.merkle_root == merkle_root({sid: shard_digest(a) for sid, a in shards.items()})
    assert manifest.format == MANIFEST_FORMAT
    assert manifest.signature is None
    manifest.check()


def test_manifest_bytes_round_trip() -> None:
    manifest = _manifest()

    again = Manifest.from_bytes(manifest.to_bytes())

    assert again == manifest
    assert again.to_bytes() == manifest.to_bytes()
    assert again.signature is None


def test_manifest_round_trip_keeps_signature() -> None:
    signed = _manifest().with_signature("c2lnbmF0dXJl")

    again = Manifest.from_bytes(signed.to_bytes())

    assert again.signature == "c2lnbmF0dXJl"
    assert again.to_bytes() == signed.to_bytes()


def test_signing_payload_excludes_the_signature() -> None:
    manifest = _manifest()
    signed = manifest.with_signature("sig-1")

    assert signed.signing_payload() == manifest.signing_payload()
    assert b"signature" not in manifest.signing_payload()
    assert b"sig-1" in signed.to_bytes()
    assert json.loads(signed.signing_payload())["merkle_root"] == manifest.merkle_root


@pytest.mark.parametrize(
    "change",
    [
        {"site_id": "site-b"},
        {"round": 4},
        {"weight": 121.0},
        {"zone": "us-1"},
        {"base_version": hashlib.sha256(b"v1").hexdigest()},
        {"plan_digest": hashlib.sha256(b"other").hexdigest()},
    ],
)
def test_signing_payload_covers_every_field(change: dict[str, object]) -> None:
    assert _manifest(**change).signing_payload() != _manifest().signing_payload()


def test_from_bytes_rejects_tampered_root() -> None:
    manifest = _manifest()
    data = _edited(manifest, merkle_root=hashlib.sha256(b"forged").hexdigest())

    with pytest.raises(IntegrityError, match=r"Merkle root .* does not match its shard list"):
        Manifest.from_bytes(data)


def test_from_bytes_rejects_tampered_shard_digest() -> None:
    manifest = _manifest()
    body = json.loads(manifest.to_bytes())
    body["shards"][1][1] = hashlib.sha256(b"other values").hexdigest()

    with pytest.raises(IntegrityError, match="Merkle root"):
        Manifest.from_bytes(json.dumps(body).encode())


def test_from_bytes_rejects_duplicated_shard() -> None:
    manifest = _manifest()
    body = json.loads(manifest.to_bytes())
    body["shards"].append(body["shards"][0])

    with pytest.raises(IntegrityError, match="lists a shard twice"):
        Manifest.from_bytes(json.dumps(body).encode())


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf")])
def test_from_bytes_rejects_weight_that_is_not_positive_and_finite(weight: float) -> None:
    data = _edited(_manifest(), weight=weight)

    with pytest.raises(IntegrityError, match="weight must be positive and finite"):
        Manifest.from_bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\xff garbage",
        b"{not json",
        b"[]",
        b"null",
        b"7",
        b'"manifest"',
        b"{}",
    ],
)
def test_from_bytes_rejects_garbage(data: bytes) -> None:
    with pytest.raises(IntegrityError):
        Manifest.from_bytes(data)


def test_noise_terms_travel_under_the_signature_and_only_where_set() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    plain = _manifest()
    assert "noise" not in json.loads(plain.signing_payload())  # manifests without shared noise: as before
    terms = "record dpsgd sigma=1.0 clip=1.0 n=3 q=1.0 lr=0.1"
    signed = _manifest(noise=terms).signed(key)
    again = Manifest.from_bytes(signed.to_bytes())
    assert again.noise == terms and again == signed
    again.verify_signature(key.public_key())
    forged = Manifest.from_bytes(_edited(signed, noise=terms.replace("sigma=1.0", "sigma=2.0")))
    with pytest.raises(IntegrityError, match="signature does not verify"):
        forged.verify_signature(key.public_key())
    for bad in ("x" * (MAX_NOISE_TERMS + 1), "sigma=1.0\nforged line", "σ=1.0"):
        with pytest.raises(IntegrityError, match="noise terms must be at most 512 printable ASCII characters"):
            Manifest.from_bytes(_edited(signed, noise=bad))


def test_manifest_names_its_hash_under_the_signature() -> None:
    manifest = _manifest()

    assert MANIFEST_FORMAT == 3
    assert json.loads(manifest.signing_payload())["hash"] == "blake3"
    assert json.loads(manifest.to_bytes())["hash"] == "blake3"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"format": 4}, "unsupported manifest format 4"),
        ({"format": None}, "unsupported manifest format None"),
        ({"hash": "sha256"}, "unsupported digest hash 'sha256'"),
        ({"hash": None}, "unsupported digest hash None"),
    ],
)
def test_from_bytes_refuses_another_format_or_hash_with_code_format(change: dict[str, object], match: str) -> None:
    with pytest.raises(IntegrityError, match=match) as info:
        Manifest.from_bytes(_edited(_manifest(), **change))

    assert info.value.code is RefusalCode.FORMAT
    assert "\n" not in str(info.value) and "manifest format 3 with blake3" in str(info.value)


def test_from_bytes_refuses_a_format_2_manifest_of_sha256_digests() -> None:
    body = json.loads(_manifest().to_bytes())
    body["format"] = 2
    del body["hash"]

    with pytest.raises(IntegrityError, match=r"manifest format 2 \(SHA-256 digests") as info:
        Manifest.from_bytes(json.dumps(body).encode())

    assert info.value.code is RefusalCode.FORMAT


@pytest.mark.parametrize(
    "change",
    [
        {"shards": [["a", "b"]]},
        {"shards": None},
        {"shards": [["a", "b", "many"]]},
        {"weight": "heavy"},
        {"round": "third"},
    ],
)
def test_from_bytes_rejects_malformed_fields(change: dict[str, object]) -> None:
    with pytest.raises(IntegrityError, match="malformed manifest"):
        Manifest.from_bytes(_edited(_manifest(), **change))


@pytest.mark.parametrize("field", ["nbytes", "round", "weight"])
def test_a_number_too_large_for_its_field_is_malformed_in_one_line(field: str) -> None:
    """Issue 32, item 12: ``nbytes`` 1e999 reached the zone's gRPC layer as an OverflowError
    (status UNKNOWN, exception text, no audit record); it is a refusal like any other."""
    body = json.loads(_manifest().to_bytes())
    huge = b"1e999" if field != "weight" else b"1" + b"0" * 400  # an integer too large for a float
    if field == "nbytes":
        body["shards"][0][2] = "HUGE"
    else:
        body[field] = "HUGE"
    data = json.dumps(body).encode().replace(b'"HUGE"', huge)

    with pytest.raises(IntegrityError, match="malformed manifest") as info:
        Manifest.from_bytes(data)

    assert refusal_code(info.value) is RefusalCode.MALFORMED
    assert "\n" not in str(info.value)


def test_a_partial_sum_header_with_a_number_too_large_is_malformed() -> None:
    header = PartialSum("eu-1", 3, "token", (PartialEntry("w#r0c0", "d" * 64, 64, 1.0, ("site-a",)),))
    data = header.to_bytes().replace(b",64,", b",1e999,")

    with pytest.raises(IntegrityError, match="malformed partial sum header") as info:
        PartialSum.from_bytes(data)

    assert refusal_code(info.value) is RefusalCode.MALFORMED


def test_from_bytes_rejects_missing_field() -> None:
    body = json.loads(_manifest().to_bytes())
    del body["zone"]

    with pytest.raises(IntegrityError, match="malformed manifest"):
        Manifest.from_bytes(json.dumps(body).encode())


def test_manifest_errors_are_one_line() -> None:
    with pytest.raises(IntegrityError) as info:
        Manifest.from_bytes(_edited(_manifest(), merkle_root="00" * 32))

    assert "\n" not in str(info.value)


# version chain ----------------------------------------------------------------------------


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_genesis_version_is_deterministic_hex() -> None:
    v0 = genesis_version(_h("plan"), _h("init"))

    assert v0 == genesis_version(_h("plan"), _h("init"))
    assert re.fullmatch(r"[0-9a-f]{64}", v0), v0
    expected = blake3(b"fedshard/genesis\x00" + bytes.fromhex(_h("plan")) + bytes.fromhex(_h("init")))
    assert v0 == expected.hexdigest()


def test_genesis_version_depends_on_plan_and_initial_parameters() -> None:
    v0 = genesis_version(_h("plan"), _h("init"))

    assert genesis_version(_h("plan2"), _h("init")) != v0
    assert genesis_version(_h("plan"), _h("init2")) != v0
    assert genesis_version(_h("init"), _h("plan")) != v0


def test_next_version_is_deterministic_and_depends_on_both_inputs() -> None:
    v0 = genesis_version(_h("plan"), _h("init"))

    v1 = next_version(v0, _h("agg1"))

    assert v1 == next_version(v0, _h("agg1"))
    assert v1 != v0
    assert next_version(v0, _h("agg1'")) != v1
    assert next_version(_h("other v0"), _h("agg1")) != v1
    assert v1 == blake3(bytes.fromhex(v0) + bytes.fromhex(_h("agg1"))).hexdigest()


def test_version_chain_depends_on_order_of_aggregates() -> None:
    v0 = genesis_version(_h("plan"), _h("init"))

    ab = next_version(next_version(v0, _h("a")), _h("b"))
    ba = next_version(next_version(v0, _h("b")), _h("a"))

    assert ab != ba
