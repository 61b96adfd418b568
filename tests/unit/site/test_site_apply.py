"""A site's fetch and decrypt: aggregates found by AggregateKey, ciphertexts as bytes,
what is encrypted told by the aggregate (never by a dtype), digests as the zone listed them."""

from __future__ import annotations

import numpy as np
import pytest

from fedshard.aggregation import ServerOptimizer
from fedshard.crypto.he import HeCodec, he_init, load_context
from fedshard.errors import IntegrityError
from fedshard.integrity import build_manifest, merkle_root, next_version
from fedshard.protocol.messages import AppliedRound, PublishedAggregate
from fedshard.protocol.rounds import DEFAULT_GROUP, AggregateKey, AggregateSummary, RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.site._apply import ModelState, RoundShards, apply_rounds, decrypt_aggregate, fetch_view
from fedshard.transports.inprocess import in_process_connector
from fedshard.zone.aggregator import ZoneAggregator
from tests.zone_helpers import BASE, TOKEN

PLAN = ShardPlan.from_state_dict({"w": np.zeros((2, 300), np.float32), "b": np.zeros(30, np.float32)}, tile=(32, 4096))
ENCRYPTED, CLEAR = PLAN.shard_ids
ZONES = {"eu-1": "unused:0"}


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> tuple[HeCodec, object]:
    secret, public = he_init(tmp_path_factory.mktemp("he"))
    return HeCodec(load_context(secret, secret=True), value_range=1.0), load_context(public, secret=False)


@pytest.fixture(scope="module")
def published(codec: tuple[HeCodec, object]) -> tuple[ZoneAggregator, AggregateSummary, dict[str, np.ndarray]]:
    """Zone ``eu-1`` that published round 1 of one site's update: ``w`` encrypted, ``b`` clear."""
    he, public = codec
    zone = ZoneAggregator("eu-1", "EU", he_context=public)
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a",), weights=(("site-a", 2.0),)))
    rng = np.random.default_rng(0)
    values = {sid: rng.normal(0, 0.1, PLAN.shard(sid).shape).astype(np.float32) for sid in PLAN.shard_ids}
    payload = {ENCRYPTED: he.encrypt(values[ENCRYPTED], 1.0)[0], CLEAR: values[CLEAR]}
    manifest = build_manifest(
        site_id="site-a", round=1, plan_digest=PLAN.digest, base_version=BASE, zone="eu-1", weight=2.0,
        shards=payload, encrypted=frozenset({ENCRYPTED}),
    )  # fmt: skip
    zone.push(manifest, TOKEN, payload)
    (summary,) = zone.close_round(1)
    return zone, summary, values


def _applied(summary: AggregateSummary, view: list[str], root: str | None = None) -> AppliedRound:
    digests = {e.shard_id: e.digest for e in summary.shards if e.shard_id in view}
    announced = PublishedAggregate(zone=summary.zone, group=summary.group, merkle_root=root or summary.merkle_root)
    return AppliedRound(round=summary.round, merkle_root=merkle_root(digests), aggregates=[announced])


def test_a_site_fetches_its_view_by_aggregate_key_with_ciphertexts_as_bytes(published) -> None:
    zone, summary, values = published
    view = {AggregateKey("eu-1", DEFAULT_GROUP): [ENCRYPTED, CLEAR]}

    fetched = fetch_view(
        "site-a", _applied(summary, view[summary.key]), view, ZONES, in_process_connector({"eu-1": zone})
    )

    assert set(fetched.means) == {CLEAR} and set(fetched.ciphertexts) == {ENCRYPTED}
    assert type(fetched.ciphertexts[ENCRYPTED]) is bytes
    np.testing.assert_array_equal(fetched.means[CLEAR], values[CLEAR])
    assert fetched.digests() == {e.shard_id: e.digest for e in summary.shards}  # as the zone listed them
    assert merkle_root(fetched.digests()) == summary.merkle_root


def test_a_site_takes_only_the_shards_its_view_names_from_the_aggregates_it_applies(published) -> None:
    zone, summary, _ = published
    connect = in_process_connector({"eu-1": zone})
    view = {AggregateKey("eu-1", DEFAULT_GROUP): [CLEAR]}

    fetched = fetch_view("site-a", _applied(summary, [CLEAR]), view, ZONES, connect)
    elsewhere = fetch_view(
        "site-a", _applied(summary, []), {AggregateKey("us-1", DEFAULT_GROUP): [CLEAR]}, ZONES, connect
    )

    assert (set(fetched.means), fetched.ciphertexts) == ({CLEAR}, {})
    assert elsewhere.shard_ids() == []  # an aggregate of another zone: nothing fetched


def test_an_aggregate_whose_root_differs_from_the_announced_one_is_refused(published) -> None:
    zone, summary, _ = published
    view = {summary.key: [CLEAR]}
    with pytest.raises(IntegrityError, match=r"has root .* the coordinator announced"):
        fetch_view(
            "site-a", _applied(summary, [CLEAR], root="00" * 32), view, ZONES, in_process_connector({"eu-1": zone})
        )


def test_encrypted_sums_are_decrypted_to_the_plans_shape_and_dtype(published, codec) -> None:
    zone, summary, values = published
    view = {summary.key: [ENCRYPTED, CLEAR]}
    fetched = fetch_view(
        "site-a", _applied(summary, view[summary.key]), view, ZONES, in_process_connector({"eu-1": zone})
    )

    means = decrypt_aggregate("site-a", PLAN, fetched, lambda: codec[0], frozenset({ENCRYPTED}))

    spec = PLAN.shard(ENCRYPTED)
    assert (means[ENCRYPTED].shape, means[ENCRYPTED].dtype) == (spec.shape, np.dtype(spec.dtype))
    np.testing.assert_allclose(means[ENCRYPTED], values[ENCRYPTED], atol=codec[0].step)
    assert fetched.ciphertexts == {}  # each ciphertext is dropped once decrypted


def test_what_is_encrypted_must_be_what_the_policy_encrypts(codec) -> None:
    blob = codec[0].encrypt(np.zeros(PLAN.shard(CLEAR).size), 1.0)[0]
    clear = np.zeros(PLAN.shard(ENCRYPTED).shape, np.float32)
    with pytest.raises(IntegrityError, match=f"shard {CLEAR} arrived encrypted, the policy sends it in clear"):
        decrypt_aggregate("site-a", PLAN, RoundShards({}, {CLEAR: blob}), lambda: codec[0], frozenset({ENCRYPTED}))
    with pytest.raises(IntegrityError, match=f"shard {ENCRYPTED} arrived in clear, the policy encrypts it"):
        decrypt_aggregate("site-a", PLAN, RoundShards({ENCRYPTED: clear}, {}), lambda: codec[0], frozenset({ENCRYPTED}))
    # without residency routing (None) the aggregate alone says what is encrypted
    means = decrypt_aggregate("site-a", PLAN, RoundShards({}, {CLEAR: blob}), lambda: codec[0], None)
    np.testing.assert_allclose(means[CLEAR], 0.0, atol=codec[0].step)


def test_applying_a_round_checks_its_root_over_the_digests_as_listed_and_extends_the_chain(published, codec) -> None:
    zone, summary, values = published
    view = {summary.key: [ENCRYPTED, CLEAR]}
    applied = _applied(summary, view[summary.key])
    shards = {sid: np.zeros(PLAN.shard(sid).shape, np.float32) for sid in PLAN.shard_ids}
    state = ModelState(BASE, BASE, 0)

    def fetch(a: AppliedRound) -> RoundShards:
        return fetch_view("site-a", a, view, ZONES, in_process_connector({"eu-1": zone}))

    def decrypt(f: RoundShards) -> dict[str, np.ndarray]:
        return decrypt_aggregate("site-a", PLAN, f, lambda: codec[0], frozenset({ENCRYPTED}))

    done = apply_rounds(state, [applied], ServerOptimizer(), shards, fetch, decrypt, plan=PLAN, site_id="site-a")

    assert done == 1 and (state.applied_round, state.version) == (1, next_version(BASE, summary.merkle_root))
    np.testing.assert_array_equal(shards[CLEAR], values[CLEAR])
    np.testing.assert_allclose(shards[ENCRYPTED], values[ENCRYPTED], atol=codec[0].step)
    wrong = applied.model_copy(update={"merkle_root": "00" * 32})
    with pytest.raises(IntegrityError, match="the aggregates of round 1 give root"):
        apply_rounds(state, [wrong], ServerOptimizer(), shards, fetch, decrypt, plan=PLAN, site_id="site-a")
    assert state.applied_round == 1  # nothing of the refused round applied
