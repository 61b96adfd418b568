"""Shard encryption under both schemes (BFV, CKKS): exact packed sums, the error bound, and zones that never
hold the secret key."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from fedshard.crypto.ciphertexts import EncryptedSum, split
from fedshard.crypto.he import (
    PACK_SLOTS,
    HeCodec,
    encrypted_nbytes,
    he_init,
    load_context,
    pack_layout,
    slots_for,
)
from fedshard.errors import ConfigError, IntegrityError, PkiError, ShardError, ZoneError
from fedshard.integrity import Manifest, build_manifest, ciphertext_digest, shard_digest
from fedshard.protocol.rounds import RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from tests.zone_helpers import BASE, TOKEN


class Keys(NamedTuple):
    secret: Path
    public: Path
    scheme: str


@pytest.fixture(scope="module", params=["bfv", "ckks"])
def keys(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(*he_init(tmp_path_factory.mktemp("he"), scheme=request.param), request.param)


@pytest.fixture(scope="module")
def codec(keys: Keys) -> HeCodec:
    return HeCodec(load_context(keys[0], secret=True, scheme=keys.scheme), value_range=1.0, max_sites=16)


def _sum(keys: Keys, blobs: list[bytes]) -> bytes:
    acc = EncryptedSum(load_context(keys[1], secret=False, scheme=keys.scheme))
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


def test_ciphertext_costs_two_or_four_times_float32_for_large_shards(keys: Keys, codec: HeCodec) -> None:
    blob, _ = codec.encrypt(np.zeros(4 * 4095), 1.0)  # 8190 value slots + 1 weight slot
    bfv = keys.scheme == "bfv"
    assert len(split(blob)) == (2 if bfv else 4)  # 4096 slots per BFV ciphertext, 2048 per CKKS one
    assert len(blob) / (4 * 4 * 4095) < (2.01 if bfv else 4.02)


def test_encrypted_nbytes_is_exact(keys: Keys, codec: HeCodec) -> None:
    # partial ciphertexts of several slot counts (TenSEAL frames the count as a varint), full ones, a spill
    counts = [1, 200, 1024, 4094, 4095, 4096, 20000]
    rng = np.random.default_rng(4)
    blobs, _ = codec.encrypt_many({str(i): rng.uniform(-1, 1, n) for i, n in enumerate(counts)}, 0.5, workers=1)
    assert encrypted_nbytes(counts, keys.scheme) == sum(len(b) for b in blobs.values())


def test_encrypted_sums_have_the_bytes_of_one_push(keys, codec: HeCodec) -> None:
    blobs = [codec.encrypt(np.full(10000, 0.5), 1.0)[0] for _ in range(3)]
    assert len(_sum(keys, blobs)) == encrypted_nbytes([10000], keys.scheme) == len(blobs[0])


def test_a_sum_of_many_sites_decrypts_within_the_bound(keys, tmp_path: Path) -> None:
    codec = HeCodec(load_context(keys[0], secret=True, scheme=keys.scheme), value_range=1.0, max_sites=64)
    rng = np.random.default_rng(3)
    updates = [rng.uniform(-1, 1, 5000) for _ in range(64)]
    blob = _sum(keys, [codec.encrypt(u, 1.0)[0] for u in updates])
    mean = codec.decrypt_mean(blob, 5000)
    assert np.max(np.abs(mean - np.mean(updates, axis=0))) <= codec.step / 2 + 1e-12


def test_the_error_bound_is_the_schemes(keys: Keys, codec: HeCodec) -> None:
    if keys.scheme == "bfv":  # 21-bit fields, 16 sites: 4 bits of headroom, one sign bit
        assert codec.levels == 2**16 - 1
        assert codec.step / 2 == pytest.approx(7.6295e-6, rel=1e-4)
    else:  # 19-bit fields
        assert codec.levels == 2**14 - 1
        assert codec.step / 2 == pytest.approx(3.0519e-5, rel=1e-4)


def test_contexts_made_by_main_he_init_load(tmp_path: Path) -> None:
    import tenseal as ts

    # exactly what main's `he-init` made (CKKS, symmetric, scale 2^20)
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS, 4096, coeff_mod_bit_sizes=[60, 49], encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC
    )
    ctx.global_scale = 2**20
    for name, secret in (("s.ctx", True), ("p.ctx", False)):
        blob = ctx.serialize(save_secret_key=secret, save_galois_keys=False, save_relin_keys=False)
        (tmp_path / name).write_bytes(blob)
    assert load_context(tmp_path / "s.ctx", secret=True, scheme="ckks").has_secret_key()
    assert not load_context(tmp_path / "p.ctx", secret=False, scheme="ckks").has_secret_key()
    with pytest.raises(ConfigError, match=r"s\.ctx is a ckks context, and he\.scheme is bfv .*--scheme bfv"):
        load_context(tmp_path / "s.ctx", secret=True, scheme="bfv")


@pytest.mark.parametrize("kind", ["bfv-modulus", "bfv-8192", "ckks-8192", "ckks-scale"])
def test_a_foreign_context_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    import tenseal as ts

    if kind.startswith("bfv"):
        ring, modulus = (8192, 4398046486529) if kind == "bfv-8192" else (4096, 2199023190017)
        ctx = ts.context(ts.SCHEME_TYPE.BFV, ring, plain_modulus=modulus, coeff_mod_bit_sizes=[60, 49])
        scheme = "bfv"
    else:
        ctx = ts.context(ts.SCHEME_TYPE.CKKS, 8192 if kind == "ckks-8192" else 4096, coeff_mod_bit_sizes=[60, 49])
        ctx.global_scale = 2**40 if kind == "ckks-scale" else 2**20
        scheme = "ckks"
    (tmp_path / "other.ctx").write_bytes(ctx.serialize(save_secret_key=True))
    with pytest.raises(ConfigError, match=rf"not a context of fedshard's schemes, .*he-init --scheme {scheme}") as err:
        load_context(tmp_path / "other.ctx", secret=True, scheme=scheme)
    assert "\n" not in str(err.value)


def test_public_context_has_no_secret_key_and_cannot_decrypt(keys, codec: HeCodec) -> None:
    public = load_context(keys[1], secret=False, scheme=keys.scheme)
    assert not public.has_secret_key()
    blob = _sum(keys, [codec.encrypt(np.ones(10), 1.0)[0]])
    with pytest.raises(Exception):  # noqa: B017 - TenSEAL raises a plain ValueError without the key
        HeCodec(public).decrypt_mean(blob, 10)


def test_zones_refuse_the_secret_context(keys) -> None:
    secret = load_context(keys[0], secret=True, scheme=keys.scheme)
    with pytest.raises(ConfigError, match="holds the secret key"):
        load_context(keys[0], secret=False, scheme=keys.scheme)
    with pytest.raises(PkiError):
        EncryptedSum(secret)
    with pytest.raises(ZoneError, match="secret key"):
        ZoneAggregator("eu-1", "EU", he_context=secret)
    with pytest.raises(ConfigError, match="has no secret key"):
        load_context(keys[1], secret=True, scheme=keys.scheme)


def test_tampered_or_foreign_ciphertext_is_an_integrity_error(keys, codec: HeCodec, tmp_path: Path) -> None:
    acc = EncryptedSum(load_context(keys[1], secret=False, scheme=keys.scheme))
    blob, _ = codec.encrypt(np.ones(10), 1.0)
    with pytest.raises(IntegrityError, match="truncated"):
        acc.add("s", blob[:-10])
    with pytest.raises(IntegrityError):
        acc.add("s", b"\x05\x00\x00\x00hello")
    other = HeCodec(load_context(he_init(tmp_path / "other", scheme=keys.scheme)[0], secret=True, scheme=keys.scheme))
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
    zone = ZoneAggregator("eu-1", "EU", he_context=load_context(keys[1], secret=False, scheme=keys.scheme))
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


# packs: several small shards share ciphertexts ----------------------------------------------


def test_pack_layout_keeps_plan_order_keys_apart_and_bounds_packs() -> None:
    shards = [("a", 1024, "g1"), ("b", 32, "g2"), ("c", 1024, "g1"), ("d", 2, "g2")]
    packs = pack_layout(shards)
    assert [p.members for p in packs] == [(("a", 1024), ("c", 1024)), (("b", 32), ("d", 2))]
    assert pack_layout(list(shards)) == packs  # from the plan and routing only: every site packs alike
    big = pack_layout([(f"t{i}", 65536, "g") for i in range(40)])
    assert all(slots_for(p.count) <= PACK_SLOTS for p in big) and sum(len(p.members) for p in big) == 40


def test_one_weight_slot_per_pack_no_spill_per_shard() -> None:
    tiles = [(f"t{i}", 65536, "g") for i in range(15)]  # a 256x256 tile fills 16 CKKS (8 BFV) ciphertexts exactly
    (pack,) = pack_layout(tiles)
    assert pack.ciphertexts("ckks") == 15 * 16 + 1  # one weight slot for the pack, not 15 spilled ciphertexts
    assert pack.ciphertexts("bfv") == 15 * 8 + 1
    assert encrypted_nbytes([pack.count], "ckks") < encrypted_nbytes([65536] * 15, "ckks")


def test_packed_pushes_are_summed_slot_wise_and_decrypt_per_shard(keys, codec: HeCodec) -> None:
    plan = ShardPlan.from_state_dict(
        {"w": np.zeros((64, 30), np.float32), "b": np.zeros(64, np.float32), "o": np.zeros(2, np.float32)},
        tile=(32, 32),
    )
    zone = ZoneAggregator("eu-1", "EU", he_context=load_context(keys[1], secret=False, scheme=keys.scheme))
    zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, ("site-a", "site-b")))
    packs = pack_layout((s.shard_id, s.size, "g") for s in plan.shards)
    (pack,) = packs
    rng = np.random.default_rng(2)
    ws = {"site-a": 0.25, "site-b": 0.75}
    xs = {site: {s.shard_id: rng.normal(0, 0.1, s.shape) for s in plan.shards} for site in ws}
    pushed = 0
    for site, x in xs.items():
        blobs, _ = codec.encrypt_packs(packs, x, ws[site], workers=1)
        assert len(blobs[pack.carrier]) == encrypted_nbytes([pack.count], keys.scheme)
        assert len(blobs) == len(plan.shards)
        assert all(blobs[sid] == b"" for sid, _ in pack.members[1:])
        pushed += sum(len(b) for b in blobs.values())
        zone.push(_encrypted_manifest(site, plan, blobs), TOKEN, blobs)
    assert pushed == 2 * encrypted_nbytes([sum(s.size for s in plan.shards)], keys.scheme)  # one ciphertext per site

    zone.close_round(1)
    aggregate = zone.fetch(1)
    means = codec.decrypt_pack(aggregate.ciphertexts[pack.carrier], pack)
    for s in plan.shards:
        expected = sum(ws[site] * xs[site][s.shard_id] for site in ws) / sum(ws.values())
        assert np.abs(means[s.shard_id].reshape(s.shape) - expected).max() <= 2 * codec.step / 2 / sum(ws.values())


def test_a_push_not_packed_as_the_plan_lays_out_is_refused(keys, codec: HeCodec) -> None:
    plan = ShardPlan.from_state_dict({"w": np.zeros((64, 30), np.float32)}, tile=(32, 32))
    zone = ZoneAggregator("eu-1", "EU", he_context=load_context(keys[1], secret=False, scheme=keys.scheme))
    zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, ("site-a", "site-b")))
    x = {s.shard_id: np.zeros(s.shape) for s in plan.shards}
    unpacked, _ = codec.encrypt_many(x, 1.0, workers=1)  # one ciphertext per shard: not the plan's layout
    with pytest.raises(ZoneError, match="packing"):
        zone.push(_encrypted_manifest("site-a", plan, unpacked), TOKEN, unpacked)


def test_a_push_packed_unlike_earlier_ones_is_refused(keys, codec: HeCodec) -> None:
    plan = ShardPlan.from_state_dict({"w": np.zeros((64, 30), np.float32)}, tile=(32, 32))
    zone = ZoneAggregator("eu-1", "EU", he_context=load_context(keys[1], secret=False, scheme=keys.scheme))
    zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, ("site-a", "site-b")))
    x = {s.shard_id: np.zeros(s.shape) for s in plan.shards}
    both, _ = codec.encrypt_packs(pack_layout((sid, 960, "g") for sid in x), x, 1.0, workers=1)
    zone.push(_encrypted_manifest("site-a", plan, both), TOKEN, both)
    last = plan.shard_ids[1]  # alone, it would be a carrier: its sum would not line up with site-a's pack
    alone = {last: codec.encrypt(x[last], 1.0)[0]}
    with pytest.raises(ZoneError, match="packed with other shards than earlier pushes"):
        zone.push(_encrypted_manifest("site-b", plan, alone), TOKEN, alone)
