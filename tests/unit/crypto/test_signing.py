"""Per-site Ed25519 manifest signing."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshard.crypto.pki import init_ca
from fedshard.crypto.signing import (
    generate_signing_key,
    load_public_key,
    load_signing_key,
    public_key_bytes,
    public_key_path,
    sign,
    verify,
)
from fedshard.errors import PkiError
from fedshard.integrity import build_manifest

PAYLOAD = b'{"round":3,"site_id":"hospital-a"}'
KEY = Ed25519PrivateKey.generate()


def test_generate_writes_private_and_public_key(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "signing.key"
    public = generate_signing_key(path)
    assert len(public) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_key_path(path) == tmp_path / "keys" / "signing.key.pub"
    assert public_key_path(path).read_text() == public.hex() + "\n"

    key = load_signing_key(path)
    assert public_key_bytes(key) == public
    assert public_key_bytes(key.public_key()) == public
    assert verify(load_public_key(public_key_path(path).read_text()), PAYLOAD, sign(key, PAYLOAD))


def test_generate_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "signing.key"
    first = generate_signing_key(path)
    with pytest.raises(PkiError, match="already exists: pass --force"):
        generate_signing_key(path)
    assert public_key_bytes(load_signing_key(path)) == first
    second = generate_signing_key(path, force=True)
    assert second != first
    assert public_key_bytes(load_signing_key(path)) == second


def test_sign_and_verify() -> None:
    signature = sign(KEY, PAYLOAD)
    assert len(signature) == 128
    int(signature, 16)
    assert verify(KEY.public_key(), PAYLOAD, signature)
    assert verify(public_key_bytes(KEY), PAYLOAD, signature)  # raw bytes are accepted as the key


def test_tampered_payload_is_refused() -> None:
    signature = sign(KEY, PAYLOAD)
    assert not verify(KEY.public_key(), PAYLOAD.replace(b"3", b"4"), signature)
    assert not verify(KEY.public_key(), PAYLOAD + b" ", signature)


def test_tampered_signature_is_refused() -> None:
    signature = sign(KEY, PAYLOAD)
    flipped = ("0" if signature[10] != "0" else "1").join((signature[:10], signature[11:]))
    assert not verify(KEY.public_key(), PAYLOAD, flipped)


def test_wrong_key_is_refused() -> None:
    other = Ed25519PrivateKey.generate()
    assert not verify(other.public_key(), PAYLOAD, sign(KEY, PAYLOAD))


@pytest.mark.parametrize(
    "garbage",
    ["", "zz" * 64, "00" * 63, "00" * 65, "ab" * 64, " " * 128, "é" * 128, None, 42, b"00" * 64],
)
def test_garbage_signature_is_false_not_an_exception(garbage: object) -> None:
    assert verify(KEY.public_key(), PAYLOAD, garbage) is False  # type: ignore[arg-type]


def test_public_key_forms(tmp_path: Path) -> None:
    raw = public_key_bytes(KEY)
    pem = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for form in (raw, raw.hex(), raw.hex().upper().encode(), pem, pem.decode()):
        assert public_key_bytes(load_public_key(form)) == raw
    for bad in (b"short", "x" * 64, "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"):
        with pytest.raises(PkiError):
            load_public_key(bad)


def test_load_signing_key_refuses_other_keys(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "ca")  # an ECDSA key, not Ed25519
    with pytest.raises(PkiError, match="not an Ed25519"):
        load_signing_key(ca.key)
    with pytest.raises(PkiError, match="not an unencrypted PEM"):
        load_signing_key(ca.cert)
    with pytest.raises(PkiError, match="cannot read"):
        load_signing_key(tmp_path / "missing.key")


def test_signs_a_manifest_payload() -> None:
    shards = {"w#0": np.arange(4, dtype=np.float32)}
    manifest = build_manifest(
        site_id="hospital-a", round=1, plan_digest="p", base_version="v0", zone="eu-1", weight=1.0, shards=shards
    )
    signed = manifest.with_signature(sign(KEY, manifest.signing_payload()))
    assert signed.signature is not None
    assert verify(KEY.public_key(), signed.signing_payload(), signed.signature)
    other_round = build_manifest(
        site_id="hospital-a", round=2, plan_digest="p", base_version="v0", zone="eu-1", weight=1.0, shards=shards
    )
    assert not verify(KEY.public_key(), other_round.signing_payload(), signed.signature)


@settings(max_examples=50, deadline=None)
@given(payload=st.binary(max_size=256), bit=st.integers(min_value=0))
def test_any_bit_flip_breaks_the_signature(payload: bytes, bit: int) -> None:
    signature = sign(KEY, payload)
    assert verify(KEY.public_key(), payload, signature)
    raw = bytearray(bytes.fromhex(signature))
    raw[(bit // 8) % len(raw)] ^= 1 << (bit % 8)
    assert not verify(KEY.public_key(), payload, raw.hex())
    if payload:
        flipped = bytearray(payload)
        flipped[(bit // 8) % len(flipped)] ^= 1 << (bit % 8)
        assert not verify(KEY.public_key(), bytes(flipped), signature)
