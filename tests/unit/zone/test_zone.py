"""Unit tests of :class:`fedshard.zone.aggregator.ZoneAggregator`, driven directly (no network).

Every refused push must raise :class:`PushRejectedError` and leave nothing behind:
each refusal test ends with :func:`assert_only_good_counted`, which has another site
push, closes the round and checks that the aggregate is exactly that site's update.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fedshard.errors import (
    AggregateNotFoundError,
    IntegrityError,
    PushRejectedError,
    RefusalCode,
    ShardError,
    ZoneError,
)
from fedshard.integrity import merkle_root, shard_digest
from fedshard.protocol.rounds import RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.store import LocalShardStore
from fedshard.zone import _publish as publish
from fedshard.zone import aggregator as aggregator_module
from fedshard.zone._push import PushSession
from fedshard.zone._staging import ByteBudget
from fedshard.zone.aggregator import ZoneAggregator
from tests.zone_helpers import (
    BASE,
    ONE_ZONE,
    ONE_ZONE_SITES,
    ONE_ZONE_WEIGHTS,
    SMALL_PLAN,
    TOKEN,
    Shards,
    assert_weighted_mean,
    one_zone_manifest,
    random_update,
)

ZONE, SITES, PLAN, WEIGHTS = ONE_ZONE, ONE_ZONE_SITES, SMALL_PLAN, ONE_ZONE_WEIGHTS
GOOD_SITE = "site-c"
manifest_for = one_zone_manifest


def make_update(seed: int, plan: ShardPlan = PLAN) -> Shards:
    return random_update(seed, plan)


def open_zone(plan: ShardPlan = PLAN, **kwargs: object) -> ZoneAggregator:
    zone = ZoneAggregator(ZONE, "EU", **kwargs)  # type: ignore[arg-type]
    zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))
    return zone


def assert_only_good_counted(zone: ZoneAggregator, counted: tuple[str, ...] = ()) -> None:
    """Have GOOD_SITE push, close round 1, and check the aggregate is its update (within the
    accumulator's stated bound: its weight is not the round's largest, so it is scaled).

    ``counted`` names sites whose earlier, accepted pushes are expected to remain.
    """
    good = make_update(seed=99)
    zone.push(manifest_for(GOOD_SITE, good, weight=2.0), TOKEN, good)
    summary = zone.close_round(1)[0]
    aggregate = zone.fetch(1).means

    assert summary.sites == (*counted, GOOD_SITE)
    if counted:
        return
    assert summary.total_weight == 2.0
    assert set(aggregate) == set(PLAN.shard_ids)
    for shard_id, values in good.items():
        assert_weighted_mean(aggregate[shard_id], [values], [2.0])


def site_a_rejected(zone: ZoneAggregator, code: str, push: Callable[[], object], match: str) -> None:
    with pytest.raises(PushRejectedError, match=match) as info:
        push()
    assert info.value.code == code
    assert "\n" not in str(info.value)
    assert_only_good_counted(zone)


@pytest.fixture
def zone() -> ZoneAggregator:
    return open_zone()


# accepted pushes ----------------------------------------------------------------------------


def test_two_sites_give_the_weighted_mean(zone: ZoneAggregator) -> None:
    a, b = make_update(1), make_update(2)

    receipt_a = zone.push(manifest_for("site-a", a, weight=1.0), TOKEN, a)
    zone.push(manifest_for("site-b", b, weight=3.0), TOKEN, b)
    summary = zone.close_round(1)[0]

    assert (receipt_a.zone, receipt_a.round, receipt_a.site_id) == (ZONE, 1, "site-a")
    assert receipt_a.shards == len(PLAN)
    assert receipt_a.bytes == PLAN.nbytes
    assert summary.zone == ZONE
    assert summary.round == 1
    assert summary.sites == ("site-a", "site-b")
    assert summary.total_weight == 4.0
    aggregate = zone.fetch(1).means
    for sid in PLAN.shard_ids:
        assert aggregate[sid].dtype == np.float32
        assert_weighted_mean(aggregate[sid], [a[sid], b[sid]], [1.0, 3.0])


def test_summary_root_is_the_merkle_root_of_the_aggregate(zone: ZoneAggregator) -> None:
    a, b = make_update(1), make_update(2)
    zone.push(manifest_for("site-a", a), TOKEN, a)
    zone.push(manifest_for("site-b", b), TOKEN, b)

    summary = zone.close_round(1)[0]
    fetched = zone.fetch(1)
    again, aggregate = fetched.summary, fetched.means

    digests = {sid: shard_digest(arr) for sid, arr in aggregate.items()}
    assert summary.merkle_root == merkle_root(digests)
    assert {e.shard_id: e.digest for e in summary.shards} == digests
    assert {e.shard_id: e.nbytes for e in summary.shards} == {sid: a.nbytes for sid, a in aggregate.items()}
    assert again == summary
    assert not fetched.ciphertexts and not any(e.encrypted for e in summary.shards)
    assert zone.close_round(1)[0] == summary


def test_aggregate_survives_a_new_zone_on_the_same_store(tmp_path: Path) -> None:
    zone = open_zone(store_dir=tmp_path)
    a, b = make_update(1), make_update(2)
    zone.push(manifest_for("site-a", a), TOKEN, a)
    zone.push(manifest_for("site-b", b), TOKEN, b)
    summary = zone.close_round(1)[0]
    aggregate = zone.fetch(1).means

    restarted = ZoneAggregator(ZONE, "EU", store_dir=tmp_path)
    reread = restarted.fetch(1)
    summary2, aggregate2 = reread.summary, reread.means

    assert summary2 == summary
    assert summary2.sites == ("site-a", "site-b")
    assert summary2.total_weight == 4.0
    assert set(aggregate2) == set(aggregate)
    for sid in aggregate:
        assert aggregate2[sid].dtype == aggregate[sid].dtype
        np.testing.assert_array_equal(aggregate2[sid], aggregate[sid])
    assert restarted.fetch(1).summary == summary  # second call: from the cached summary
    with pytest.raises(ZoneError, match="no regional/any aggregate for round 2"):
        restarted.fetch(2)


def _publish_round(zone: ZoneAggregator, rnd: int, seed: int) -> Shards:
    """Open round ``rnd`` (unless open), have site-a push, close it; site-a's update."""
    token = TOKEN if rnd == 1 else f"t{rnd}"
    if rnd not in zone._z.open:
        zone.open_round(RoundSpec(rnd, token, PLAN.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))
    update = make_update(seed)
    zone.push(manifest_for("site-a", update, round=rnd), token, update)
    zone.close_round(rnd)
    return update


@pytest.mark.parametrize(("stored", "large"), [(True, True), (True, False), (False, True)])
def test_the_latest_aggregates_are_served_from_memory_until_the_next_round_closes(
    tmp_path: Path, stored: bool, large: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if large:  # every aggregate counts as large
        monkeypatch.setattr(publish, "KEEP_IN_MEMORY", 0)
    zone = open_zone(store_dir=tmp_path if stored else None)
    _publish_round(zone, 1, 1)
    held = zone.fetch(1).means
    zone.open_round(RoundSpec(2, "t2", PLAN.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))
    # every site fetches round 1 with its round-2 train message: from memory, no store read
    assert all(zone.fetch(1).means[sid] is held[sid] for sid in held)
    still_held: list[bool] = []
    build = aggregator_module.build_aggregate

    def watched(*args: object, **kwargs: object) -> object:
        still_held.append(any(aggregate.means is held for aggregate, _ in zone._published._latest.values()))
        return build(*args, **kwargs)

    monkeypatch.setattr(aggregator_module, "build_aggregate", watched)
    _publish_round(zone, 2, 2)

    # stored and large: round 1 left memory before round 2's sums became its aggregates (a zone holds one
    # model's worth then, not two); a small one, or one without a store (its only copy), stayed until replaced
    assert still_held == [not (stored and large)]
    if stored:
        after = zone.fetch(1).means  # read back from the store, checked
        for sid in held:
            assert after[sid] is not held[sid]
            np.testing.assert_array_equal(after[sid], held[sid])
    else:
        with pytest.raises(AggregateNotFoundError, match="keeps only the latest without a store"):
            zone.fetch(1)


def test_fetches_of_a_stored_aggregate_at_the_same_time_share_one_read_and_nothing_is_kept_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zone = open_zone(store_dir=tmp_path)
    a = _publish_round(zone, 1, 1)
    _publish_round(zone, 2, 2)  # round 1 is no longer the latest: read back from the store
    store = zone._published._store
    assert store is not None
    reads: list[int] = []
    load = store.load
    monkeypatch.setattr(store, "load", lambda *args: reads.append(1) or load(*args))

    first = zone.fetch(1)  # a fetch still streaming it
    second = zone.fetch(1)  # another site's, meanwhile
    assert second is first and len(reads) == 1
    del first, second
    third = zone.fetch(1)  # no fetch holds it now: it was not kept, so it is read again
    assert len(reads) == 2
    np.testing.assert_array_equal(third.means[next(iter(a))], zone.fetch(1).means[next(iter(a))])


@pytest.mark.parametrize("fmt", [None, 2])
def test_a_stored_aggregate_of_the_sha256_era_is_refused_with_one_line(tmp_path: Path, fmt: int | None) -> None:
    # Formats 1 (no "format" key) and 2: written before BLAKE3, their roots are over SHA-256 digests.
    mean = np.full((4, 4), 0.25, np.float32)
    meta = {"zone": ZONE, "round": 1, "group": "regional/any", "merkle_root": "ab" * 32, "total_weight": 2.0}
    meta |= {"sites": ["site-a"], "contributors": {"w#r0c0": ["site-a"]}}
    if fmt is not None:
        meta |= {"format": fmt, "encrypted": []}
    LocalShardStore(tmp_path).save("aggregate-000001-regional-any", {"w#r0c0": mean}, meta)

    with pytest.raises(IntegrityError, match=f"is of format {fmt or 1}, written before BLAKE3 digests") as info:
        ZoneAggregator(ZONE, store_dir=tmp_path).fetch(1)

    assert info.value.code is RefusalCode.CORRUPT and "\n" not in str(info.value)
    assert LocalShardStore(tmp_path).load("aggregate-000001-regional-any")[0] == meta  # left as it is


def test_stored_aggregate_that_was_tampered_with_fails_its_root(tmp_path: Path) -> None:
    zone = open_zone(store_dir=tmp_path)
    a = make_update(1)
    zone.push(manifest_for("site-a", a), TOKEN, a)
    zone.close_round(1)[0]
    store = LocalShardStore(tmp_path)  # what the zone wrote, edited behind its back
    meta, shards = store.load("aggregate-000001-regional-any")
    shards["w#r0c0"] = shards["w#r0c0"] + 1
    store.save("aggregate-000001-regional-any", shards, meta)

    # the running zone serves the aggregate it computed, not the edited file
    kept = zone.fetch(1)
    summary, served = kept.summary, kept.means
    assert merkle_root({sid: shard_digest(v) for sid, v in served.items()}) == summary.merkle_root
    # a restarted zone reads the file and refuses it
    with pytest.raises(IntegrityError, match="fails its Merkle root") as info:
        ZoneAggregator(ZONE, store_dir=tmp_path).fetch(1)
    assert info.value.code is RefusalCode.CORRUPT


def test_round_with_no_push_publishes_nothing(zone: ZoneAggregator) -> None:
    assert zone.close_round(1) == []
    with pytest.raises(AggregateNotFoundError):
        zone.fetch(1)


def test_chunked_push_is_reassembled(zone: ZoneAggregator) -> None:
    a = make_update(5)
    with zone.begin_push(manifest_for("site-a", a), TOKEN) as session:
        for shard_id, values in a.items():
            raw = values.tobytes()
            for offset in range(0, len(raw), 12):
                first = offset == 0
                session.receive(
                    shard_id,
                    raw[offset : offset + 12],
                    offset=offset,
                    dtype=values.dtype.str if first else "",
                    shape=values.shape if first else (),
                )
        session.commit()

    assert_only_good_counted(zone, counted=("site-a",))
    aggregate = zone.fetch(1).means
    for sid in PLAN.shard_ids:
        assert_weighted_mean(aggregate[sid], [a[sid], make_update(99)[sid]], [1.0, 2.0])


def test_chunked_push_into_an_assembly_buffer() -> None:
    zone = open_zone()  # shards that arrive in more than one chunk are assembled in a preallocated buffer
    a = make_update(5)
    with zone.begin_push(manifest_for("site-a", a), TOKEN) as session:
        for shard_id, values in a.items():
            raw = values.tobytes()
            for offset in range(0, len(raw), 24):
                session.receive(shard_id, raw[offset : offset + 24], offset=offset, dtype="<f4", shape=values.shape)
        session.commit()

    summary = zone.close_round(1)[0]
    aggregate = zone.fetch(1).means
    assert summary.sites == ("site-a",)
    for sid, values in a.items():
        assert_weighted_mean(aggregate[sid], [values], [1.0])


def test_push_of_a_subset_of_the_plan_is_accepted(zone: ZoneAggregator) -> None:
    a = make_update(1)
    subset = {sid: a[sid] for sid in ("w#r0c0", "b#r1c0")}

    zone.push(manifest_for("site-a", subset), TOKEN, subset)
    summary = zone.close_round(1)[0]

    assert [e.shard_id for e in summary.shards] == ["w#r0c0", "b#r1c0"]


def test_zero_size_shard_is_accepted() -> None:
    plan = ShardPlan.from_state_dict({"empty": np.zeros((0, 3), np.float32), "w": np.zeros((2, 2), np.float32)})
    zone = open_zone(plan)
    update = plan.split({"empty": np.zeros((0, 3), np.float32), "w": np.ones((2, 2), np.float32)})

    zone.push(manifest_for("site-a", update, plan=plan), TOKEN, update)
    aggregate = zone.fetch(zone.close_round(1)[0].round).means

    assert aggregate["empty#r0c0"].shape == (0, 3)
    np.testing.assert_array_equal(aggregate["w#r0c0"], np.ones((2, 2), np.float32))


# refused pushes: whole updates -----------------------------------------------------------------


def test_unknown_round_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    site_a_rejected(zone, "round", lambda: zone.push(manifest_for("site-a", a, round=7), TOKEN, a), "round is not open")


def test_closed_round_is_refused(zone: ZoneAggregator) -> None:
    good = make_update(99)
    zone.push(manifest_for(GOOD_SITE, good, weight=2.0), TOKEN, good)
    summary = zone.close_round(1)[0]
    a = make_update(1)

    with pytest.raises(PushRejectedError, match="round is closed") as info:
        zone.push(manifest_for("site-a", a), TOKEN, a)

    assert info.value.code == "round"
    assert zone.close_round(1)[0] == summary
    assert zone.fetch(1).summary.sites == (GOOD_SITE,)
    for sid, values in good.items():
        assert_weighted_mean(zone.fetch(1).means[sid], [values], [2.0])


def test_aborted_round_is_refused(zone: ZoneAggregator) -> None:
    zone.abort_round(1)
    a = make_update(1)

    with pytest.raises(PushRejectedError, match="round is not open"):
        zone.push(manifest_for("site-a", a), TOKEN, a)
    with pytest.raises(ZoneError, match="round 1 is not open"):
        zone.close_round(1)[0]


def test_wrong_token_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    site_a_rejected(zone, "token", lambda: zone.push(manifest_for("site-a", a), "stale-token", a), "round token")


def test_site_not_selected_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    site_a_rejected(zone, "site", lambda: zone.push(manifest_for("site-z", a), TOKEN, a), "not selected")


def test_same_site_pushing_twice_is_refused(zone: ZoneAggregator) -> None:
    first, second = make_update(1), make_update(2)
    zone.push(manifest_for("site-a", first, weight=1.0), TOKEN, first)

    with pytest.raises(PushRejectedError, match="already pushed") as info:
        zone.push(manifest_for("site-a", second, weight=5.0), TOKEN, second)

    assert info.value.code == "duplicate"
    summary = zone.close_round(1)[0]
    assert summary.sites == ("site-a",)
    assert summary.total_weight == 1.0
    aggregate = zone.fetch(1).means
    for sid, values in first.items():
        assert_weighted_mean(aggregate[sid], [values], [1.0])


def test_site_pushing_while_its_push_is_in_progress_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    with zone.begin_push(manifest_for("site-a", a), TOKEN):
        with pytest.raises(PushRejectedError, match="already pushed") as info:
            zone.begin_push(manifest_for("site-a", a), TOKEN)
        assert info.value.code == "duplicate"

    assert_only_good_counted(zone)


def test_plan_digest_mismatch_is_refused(zone: ZoneAggregator) -> None:
    other = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32), "b": np.zeros(5, np.float32)}, tile=(4, 8))
    a = make_update(1)
    site_a_rejected(zone, "plan", lambda: zone.push(manifest_for("site-a", a, plan=other), TOKEN, a), "shard plan")


def test_base_version_mismatch_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    manifest = manifest_for("site-a", a, base="cd" * 32)
    site_a_rejected(zone, "version", lambda: zone.push(manifest, TOKEN, a), "model version cdcdcdcdcdcd")


def test_wrong_zone_in_manifest_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    site_a_rejected(
        zone, "zone", lambda: zone.push(manifest_for("site-a", a, zone="us-1"), TOKEN, a), "addressed to zone 'us-1'"
    )


def test_manifest_shard_not_in_plan_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    a["w#r9c9"] = np.zeros((4, 4), np.float32)
    site_a_rejected(
        zone, "unknown-shard", lambda: zone.push(manifest_for("site-a", a), TOKEN, a), "w#r9c9 is not in the round"
    )


def test_manifest_size_that_differs_from_the_plan_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    wide = {**a, "w#r0c0": a["w#r0c0"].astype(np.float64)}
    site_a_rejected(
        zone, "shape", lambda: zone.push(manifest_for("site-a", wide), TOKEN, a), "w#r0c0: manifest says 128 bytes"
    )


def test_shard_not_in_manifest_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    listed = {sid: v for sid, v in a.items() if sid != "b#r1c0"}
    site_a_rejected(
        zone, "unknown-shard", lambda: zone.push(manifest_for("site-a", listed), TOKEN, a), "b#r1c0 is not listed"
    )


def test_digest_mismatch_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    manifest = manifest_for("site-a", a)
    a["w#r1c1"] = a["w#r1c1"].copy()
    a["w#r1c1"][1, 2] += 1.0
    site_a_rejected(zone, "digest", lambda: zone.push(manifest, TOKEN, a), "w#r1c1: digest does not match")


def test_dtype_mismatch_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    manifest = manifest_for("site-a", a)
    a["w#r0c1"] = a["w#r0c1"].astype(np.float64)
    site_a_rejected(zone, "dtype", lambda: zone.push(manifest, TOKEN, a), "w#r0c1 has dtype <f8, the plan says <f4")


def test_shape_mismatch_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    manifest = manifest_for("site-a", a)
    a["w#r0c0"] = a["w#r0c0"].reshape(2, 8)
    site_a_rejected(zone, "shape", lambda: zone.push(manifest, TOKEN, a), r"w#r0c0 has shape \(2, 8\)")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused(zone: ZoneAggregator, bad: float) -> None:
    a = make_update(1)
    a["b#r0c0"][2, 0] = bad
    manifest = manifest_for("site-a", a)  # built from the bad values, so only finiteness fails
    site_a_rejected(zone, "non-finite", lambda: zone.push(manifest, TOKEN, a), "b#r0c0 contains NaN or infinite")


# refused pushes: frame by frame ---------------------------------------------------------------


def _receive(session: PushSession, shard_id: str, values: np.ndarray, **overrides: object) -> None:
    kwargs: dict[str, object] = {"offset": 0, "dtype": values.dtype.str, "shape": values.shape}
    kwargs.update(overrides)
    session.receive(shard_id, values.tobytes(), **kwargs)


def _frames_rejected(zone: ZoneAggregator, code: str, match: str, feed: Callable[[PushSession, Shards], None]) -> None:
    a = make_update(1)
    with zone.begin_push(manifest_for("site-a", a), TOKEN) as session:
        with pytest.raises(PushRejectedError, match=match) as info:
            feed(session, a)
        assert info.value.code == code
        assert "\n" not in str(info.value)
    assert_only_good_counted(zone)


def test_duplicate_shard_frame_is_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        _receive(session, "w#r0c0", a["w#r0c0"])
        _receive(session, "w#r0c1", a["w#r0c1"])
        _receive(session, "w#r0c0", a["w#r0c0"])

    _frames_rejected(zone, "duplicate", "w#r0c0 sent twice", feed)


def test_missing_shard_is_refused_at_commit(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        for sid, values in a.items():
            if sid != "w#r1c0":
                _receive(session, sid, values)
        session.commit()

    _frames_rejected(zone, "missing", "never arrived, e.g. w#r1c0", feed)


def test_truncated_shard_is_refused_at_commit(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        for sid, values in a.items():
            if sid != "w#r1c1":
                _receive(session, sid, values)
        raw = a["w#r1c1"].tobytes()[:-4]  # the last shard sent stops one value short
        session.receive("w#r1c1", raw, offset=0, dtype="<f4", shape=(2, 4))
        session.commit()

    _frames_rejected(zone, "truncated", "w#r1c1 is incomplete", feed)


def test_truncated_shard_followed_by_another_is_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        raw = a["w#r0c0"].tobytes()
        session.receive("w#r0c0", raw[:20], offset=0, dtype="<f4", shape=(4, 4))
        _receive(session, "w#r0c1", a["w#r0c1"])

    _frames_rejected(zone, "truncated", "w#r0c0 ended after 20 bytes", feed)


def test_first_chunk_at_wrong_offset_is_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        _receive(session, "w#r0c0", a["w#r0c0"], offset=8)

    _frames_rejected(zone, "offset", "w#r0c0 starts at offset 8, expected 0", feed)


def test_later_chunk_at_wrong_offset_is_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        raw = a["w#r0c0"].tobytes()
        session.receive("w#r0c0", raw[:16], offset=0, dtype="<f4", shape=(4, 4))
        session.receive("w#r0c0", raw[24:40], offset=24)

    _frames_rejected(zone, "offset", "w#r0c0: chunk at offset 24, expected 16", feed)


def test_repeated_chunk_is_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        raw = a["w#r0c0"].tobytes()
        session.receive("w#r0c0", raw[:16], offset=0, dtype="<f4", shape=(4, 4))
        session.receive("w#r0c0", raw[:16], offset=0)

    _frames_rejected(zone, "offset", "chunk at offset 0, expected 16", feed)


def test_more_bytes_than_the_plan_are_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        raw = a["w#r0c0"].tobytes()
        session.receive("w#r0c0", raw + raw[:4], offset=0, dtype="<f4", shape=(4, 4))

    _frames_rejected(zone, "shape", "more than the plan's 64 bytes", feed)


@pytest.mark.parametrize("dtype", ["", ">f4", "<f8", "<i4", "not-a-dtype", "f4,f4"])
def test_first_chunk_with_wrong_dtype_label_is_refused(zone: ZoneAggregator, dtype: str) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        _receive(session, "w#r0c0", a["w#r0c0"], dtype=dtype)

    _frames_rejected(zone, "dtype", "w#r0c0 has dtype", feed)


def test_float64_bytes_labelled_f8_are_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        _receive(session, "w#r0c0", a["w#r0c0"].astype("<f8"))

    _frames_rejected(zone, "dtype", "w#r0c0 has dtype <f8", feed)


def test_first_chunk_with_wrong_shape_is_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        _receive(session, "w#r1c0", a["w#r1c0"], shape=(4, 2))

    _frames_rejected(zone, "shape", r"w#r1c0 has shape \(4, 2\), the plan says \(2, 4\)", feed)


def test_frame_for_shard_not_in_plan_is_refused(zone: ZoneAggregator) -> None:
    def feed(session: PushSession, a: Shards) -> None:
        _receive(session, "x#r0c0", a["w#r0c0"])

    _frames_rejected(zone, "unknown-shard", "x#r0c0 is not in the round's shard plan", feed)


def test_session_is_finished_after_a_refusal(zone: ZoneAggregator) -> None:
    a = make_update(1)
    with zone.begin_push(manifest_for("site-a", a), TOKEN) as session:
        _receive(session, "w#r0c0", a["w#r0c0"])
        with pytest.raises(PushRejectedError, match="sent twice"):
            _receive(session, "w#r0c0", a["w#r0c0"])
        # The sender ignores the refusal and carries on: the push stays refused.
        for sid, values in a.items():
            if sid != "w#r0c0":
                with pytest.raises(PushRejectedError):
                    _receive(session, sid, values)
        with pytest.raises(PushRejectedError):
            session.commit()

    assert_only_good_counted(zone)


def test_receive_after_commit_is_refused(zone: ZoneAggregator) -> None:
    a = make_update(1)
    with zone.begin_push(manifest_for("site-a", a), TOKEN) as session:
        for sid, values in a.items():
            _receive(session, sid, values)
        session.commit()
        with pytest.raises(PushRejectedError, match="already finished") as info:
            _receive(session, "w#r0c0", a["w#r0c0"])

    assert info.value.code == "state"
    assert zone.close_round(1)[0].sites == ("site-a",)


def test_commit_after_round_closed_is_refused() -> None:
    zone = open_zone()
    a = make_update(1)
    with zone.begin_push(manifest_for("site-a", a), TOKEN) as session:
        for sid, values in a.items():
            _receive(session, sid, values)
        assert zone.close_round(1) == []
        with pytest.raises(PushRejectedError, match="closed during the push"):
            session.commit()

    assert zone.close_round(1) == []


def test_refused_site_may_push_again(zone: ZoneAggregator) -> None:
    a = make_update(1)
    manifest = manifest_for("site-a", a)
    tampered = {**a, "w#r0c0": a["w#r0c0"] + 1}
    with pytest.raises(PushRejectedError, match="digest"):
        zone.push(manifest, TOKEN, tampered)

    zone.push(manifest, TOKEN, a)

    assert zone.close_round(1)[0].sites == ("site-a",)


# round lifecycle ------------------------------------------------------------------------------


def test_opening_a_round_twice_is_a_zone_error(zone: ZoneAggregator) -> None:
    with pytest.raises(ZoneError, match="already opened"):
        zone.open_round(RoundSpec(1, "other", PLAN.to_json(), BASE, SITES))


def test_closing_an_unknown_round_is_a_zone_error(zone: ZoneAggregator) -> None:
    with pytest.raises(ZoneError, match="round 5 is not open"):
        zone.close_round(5)[0]


def test_aggregate_of_an_open_round_is_a_zone_error(zone: ZoneAggregator) -> None:
    with pytest.raises(ZoneError, match="no regional/any aggregate for round 1"):
        zone.fetch(1)


def test_open_round_with_a_bad_plan_is_a_shard_error() -> None:
    with pytest.raises(ShardError):
        ZoneAggregator(ZONE).open_round(RoundSpec(1, TOKEN, "{}", BASE, SITES))


# staging budget -------------------------------------------------------------------------------


def test_budget_lets_an_oversized_request_through_alone() -> None:
    budget = ByteBudget(100)

    assert budget.acquire(1000, timeout=0)
    assert not budget.acquire(1, timeout=0.01)
    budget.release(1000)
    assert budget.acquire(1, timeout=0)


def test_budget_acquire_times_out_when_full() -> None:
    budget = ByteBudget(100)

    assert budget.acquire(60)
    assert not budget.acquire(60, timeout=0.01)
    assert budget.acquire(40, timeout=0)
    assert not budget.acquire(1, timeout=0)


def test_budget_release_wakes_a_waiter() -> None:
    budget = ByteBudget(100)
    budget.acquire(80)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(budget.acquire(50, timeout=30)))
    waiter.start()

    budget.release(80)
    waiter.join(timeout=30)

    assert result == [True]


def test_budget_trims_the_heap_only_when_freed_staging_memory_could_exceed_it(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr("fedshard.zone._staging.release_free_memory", lambda: trims.append(1) or True)
    budget = ByteBudget(100)

    for _ in range(2):  # 40 in use, then 40 retained + 40 in use: within the capacity
        assert budget.acquire(40)
        budget.release(40)
    assert trims == []
    assert budget.acquire(40)  # 80 retained + 40 in use > 100: trimmed first
    assert trims == [1]
    budget.release(40)
    assert budget.acquire(40)  # 40 retained + 40 in use again
    assert trims == [1]


def test_zone_busy_when_staging_budget_is_full() -> None:
    a, b = make_update(1), make_update(2)
    zone = open_zone(staging_bytes=PLAN.nbytes)
    with zone.begin_push(manifest_for("site-a", a), TOKEN), pytest.raises(ZoneError, match="busy"):
        zone.begin_push(manifest_for("site-b", b), TOKEN, timeout=0.01)

    # Neither the aborted push nor the timed-out one holds the budget or the site any more.
    zone.push(manifest_for("site-b", b), TOKEN, b)
    zone.push(manifest_for("site-a", a), TOKEN, a)
    assert zone.close_round(1)[0].sites == ("site-a", "site-b")


def test_a_zone_counts_what_left_it_in_partial_sums_by_class_and_origin_and_keeps_it(tmp_path: Path) -> None:
    """The report says what left a region from these counts: each site's shard inside a
    forwarded partial sum, by the shard's class and the site's jurisdiction."""
    from fedshard.zone._stats import ZoneStats

    stats = ZoneStats()
    entries = [("w#r0c0", ("mayo", "nyp")), ("b#r0c0", ("mayo",))]
    stats.count_forward(entries, {"w#r0c0": "personal", "b#r0c0": "public"}, {"mayo": "US", "nyp": "US"})
    assert stats.forwarded_by_class == {"personal from US": 2, "public from US": 1}
    stats.save(tmp_path / "stats.json")
    again = ZoneStats()
    again.load(tmp_path / "stats.json")  # a restarted zone's counters cover the whole run
    assert again.as_dict()["forwarded_by_class"] == {"personal from US": 2, "public from US": 1}
