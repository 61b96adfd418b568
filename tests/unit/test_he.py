"""CKKS shard encryption: exact packed sums, the error bound, and zones that never hold the secret key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.he import EncryptedSum, HeCodec, he_init, load_context, split
from fedshard.errors import ConfigError, IntegrityError, PkiError, ZoneError
from fedshard.zone.aggregator import ZoneAggregator


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return he_init(tmp_path_factory.mktemp("he"))


@pytest.fixture(scope="module")
def codec(keys: tuple[Path, Path]) -> HeCodec:
    return HeCodec(load_context(keys[0], secret=True), value_range=1.0, max_sites=16)


def _sum(keys: tuple[Path, Path], blobs: list[bytes]) -> bytes:
    acc = EncryptedSum(load_context(keys[1], secret=False))
    for b in blobs:
        acc.add("s", b)
    return acc.serialize("s")


def test_weighted_mean_of_encrypted_shards_is_within_the_quantisation_bound(keys, codec: HeCodec) -> None:
    rng = np.random.default_rng(0)
    count = 5001  # odd: the last slot holds one value
    xs = [rng.normal(0, 0.1, count) for _ in range(5)]
    ws = [0.2, 1.0, 0.5, 0.75, 0.33]
    mean = codec.decrypt_mean(_sum(keys, [codec.encrypt(x, w)[0] for x, w in zip(xs, ws, strict=True)]), count)
    expected = sum(w * x for x, w in zip(xs, ws, strict=True)) / sum(ws)
    # each site's value is off by at most step/2; the weighted mean by at most that over the weight sum
    bound = len(xs) * codec.step / 2 / sum(ws)
    assert np.abs(mean - expected).max() <= bound
    assert np.abs(mean - expected).max() > 0  # quantised, not exact


def test_extreme_values_of_the_most_sites_sum_without_overflow(keys, codec: HeCodec) -> None:
    for sign in (1.0, -1.0):
        blobs = [codec.encrypt(np.full(4095, sign), 1.0)[0] for _ in range(codec.max_sites)]
        assert np.array_equal(codec.decrypt_mean(_sum(keys, blobs), 4095), np.full(4095, sign))


def test_values_beyond_the_range_are_clipped_and_counted(codec: HeCodec) -> None:
    _, clipped = codec.encrypt(np.array([0.5, 2.0, -3.0, 1.0]), 1.0)
    assert clipped == 2


def test_ciphertext_costs_four_times_float32_for_large_shards(codec: HeCodec) -> None:
    blob, _ = codec.encrypt(np.zeros(4 * 4095), 1.0)  # 8190 value slots + 1 weight slot = 4 ciphertexts
    assert len(split(blob)) == 4
    assert len(blob) / (4 * 4 * 4095) < 4.1


def test_public_context_has_no_secret_key_and_cannot_decrypt(keys, codec: HeCodec) -> None:
    public = load_context(keys[1], secret=False)
    assert not public.has_secret_key()
    blob = _sum(keys, [codec.encrypt(np.ones(10), 1.0)[0]])
    with pytest.raises(Exception):  # noqa: B017 - TenSEAL raises a plain ValueError without the key
        HeCodec(public).decrypt_mean(blob, 10)


def test_zones_refuse_the_secret_context(keys) -> None:
    secret = load_context(keys[0], secret=True)
    with pytest.raises(ConfigError, match="holds the secret key"):
        load_context(keys[0], secret=False)
    with pytest.raises(PkiError):
        EncryptedSum(secret)
    with pytest.raises(ZoneError, match="secret key"):
        ZoneAggregator("eu-1", "EU", he_context=secret)
    with pytest.raises(ConfigError, match="has no secret key"):
        load_context(keys[1], secret=True)


def test_tampered_or_foreign_ciphertext_is_an_integrity_error(keys, codec: HeCodec, tmp_path: Path) -> None:
    acc = EncryptedSum(load_context(keys[1], secret=False))
    blob, _ = codec.encrypt(np.ones(10), 1.0)
    with pytest.raises(IntegrityError, match="truncated"):
        acc.add("s", blob[:-10])
    with pytest.raises(IntegrityError):
        acc.add("s", b"\x05\x00\x00\x00hello")
    other = HeCodec(load_context(he_init(tmp_path / "other")[0], secret=True))
    acc.add("s", blob)
    foreign, _ = other.encrypt(np.ones(10), 1.0)
    acc.add("s", foreign)  # same parameters: it adds, but the sum decrypts to garbage under our key
    try:
        mean = codec.decrypt_mean(acc.serialize("s"), 10)
    except IntegrityError:
        return  # the garbage weight gave it away
    assert not np.allclose(mean, 1.0, atol=1e-3)


def test_he_init_refuses_to_overwrite(tmp_path: Path) -> None:
    he_init(tmp_path)
    with pytest.raises(PkiError):
        he_init(tmp_path)
    assert (tmp_path / "secret.ctx").stat().st_mode & 0o777 == 0o600
