"""CKKS shard encryption: exact packed sums, the error bound, and zones that never hold the secret key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.he import EncryptedSum, HeCodec, he_init, load_context, split
from fedshard.errors import ConfigError, IntegrityError, PkiError, ShardError, ZoneError
from fedshard.integrity import Manifest, build_manifest, ciphertext_digest, shard_digest
from fedshard.protocol.rounds import RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from tests.zone_helpers import BASE, TOKEN


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


# ciphertexts are bytes end to end at a zone ---------------------------------------------------


def _encrypted_round(keys: tuple[Path, Path]) -> tuple[ZoneAggregator, ShardPlan, str]:
    plan = ShardPlan.from_state_dict({"w": np.zeros((2, 3000), np.float32)}, tile=(2, 4096))
    zone = ZoneAggregator("eu-1", "EU", he_context=load_context(keys[1], secret=False))
    zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, ("site-a", "site-b")))
    return zone, plan, plan.shard_ids[0]


def _encrypted_manifest(site: str, plan: ShardPlan, shards: dict[str, bytes]) -> Manifest:
    return build_manifest(
        site_id=site,
        round=1,
        plan_digest=plan.digest,
        base_version=BASE,
        zone="eu-1",
        weight=1.0,
        shards=shards,
        encrypted=frozenset(shards),
    )


def test_encrypted_pushes_are_summed_and_served_as_bytes(keys, codec: HeCodec) -> None:
    zone, plan, sid = _encrypted_round(keys)
    rng = np.random.default_rng(1)
    xs = {"site-a": rng.normal(0, 0.1, (2, 3000)), "site-b": rng.normal(0, 0.1, (2, 3000))}
    ws = {"site-a": 0.25, "site-b": 0.75}
    for site, x in xs.items():
        blob = {sid: codec.encrypt(x, ws[site])[0]}
        zone.push(_encrypted_manifest(site, plan, blob), TOKEN, blob)

    (summary,) = zone.close_round(1)
    aggregate = zone.fetch(1)

    (entry,) = summary.shards
    data = aggregate.ciphertexts[sid]
    assert type(data) is bytes and not aggregate.means
    assert (entry.encrypted, entry.nbytes, entry.digest) == (True, len(data), ciphertext_digest(data))
    assert aggregate.payload() == {sid: data}
    mean = codec.decrypt_mean(data, 6000).reshape(2, 3000)
    expected = sum(ws[s] * xs[s] for s in xs) / sum(ws.values())
    assert np.abs(mean - expected).max() <= 2 * codec.step / 2 / sum(ws.values())


def test_a_restarted_zone_serves_the_stored_ciphertexts_as_bytes(keys, codec: HeCodec, tmp_path: Path) -> None:
    zone, plan, sid = _encrypted_round(keys)
    zone = ZoneAggregator("eu-1", "EU", store_dir=tmp_path, he_context=zone.he_context)
    zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, ("site-a", "site-b")))
    blob = {sid: codec.encrypt(np.ones(6000), 1.0)[0]}
    zone.push(_encrypted_manifest("site-a", plan, blob), TOKEN, blob)
    (summary,) = zone.close_round(1)

    restarted = ZoneAggregator("eu-1", "EU", store_dir=tmp_path).fetch(1)

    assert restarted.summary == summary
    assert restarted.ciphertexts == zone.fetch(1).ciphertexts and not restarted.means
    assert type(restarted.ciphertexts[sid]) is bytes


def test_ciphertext_digests_are_those_of_the_arrays_ciphertexts_used_to_travel_as(codec: HeCodec) -> None:
    blob, _ = codec.encrypt(np.ones(10), 1.0)

    assert ciphertext_digest(blob) == shard_digest(np.frombuffer(blob, np.uint8).reshape(1, -1))


def test_ciphertexts_handed_over_as_uint8_arrays_are_refused(keys, codec: HeCodec) -> None:
    zone, plan, sid = _encrypted_round(keys)
    blob, _ = codec.encrypt(np.zeros(6000), 1.0)
    as_array = {sid: np.frombuffer(blob, np.uint8).reshape(1, -1)}  # how ciphertexts travelled before bytes
    manifest = _encrypted_manifest("site-a", plan, {sid: blob})

    with pytest.raises(ShardError, match="listed as encrypted but holds uint8 values, not ciphertext bytes"):
        _encrypted_manifest("site-a", plan, as_array)  # type: ignore[arg-type]
    with pytest.raises(ShardError, match="listed as encrypted but holds uint8 values, not ciphertext bytes"):
        zone.push(manifest, TOKEN, as_array)

    assert zone.close_round(1) == []  # nothing counted
    assert not hasattr(zone, "aggregate")  # served only as bytes, by fetch


def test_bytes_for_a_clear_shard_or_values_for_an_encrypted_one_are_refused_at_the_source(codec: HeCodec) -> None:
    plan = ShardPlan.from_state_dict({"w": np.zeros((2, 3), np.float32)})
    blob, _ = codec.encrypt(np.zeros(6), 1.0)
    fields = dict(site_id="s", round=1, plan_digest=plan.digest, base_version=BASE, zone="z", weight=1.0)

    with pytest.raises(ShardError, match="w#r0c0 is ciphertext bytes but not listed as encrypted"):
        build_manifest(**fields, shards={"w#r0c0": blob})  # type: ignore[arg-type]
    with pytest.raises(ShardError, match="listed as encrypted but holds float32 values"):
        build_manifest(**fields, shards={"w#r0c0": np.zeros((2, 3), np.float32)}, encrypted=frozenset({"w#r0c0"}))  # type: ignore[arg-type]
