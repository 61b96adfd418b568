"""Forwarded partial sums at the reducing zone, driven directly: a forward is a transaction
like a push. Every refused forward raises :class:`PushRejectedError` with its code and
leaves nothing behind: each refusal test ends with :func:`assert_only_good_counted`,
which has the zone forward again, closes the round and checks the global aggregate is
exactly that good forward's mean.

A partial sum is ``S = Σ (w/unit)·x`` with ``unit`` the round's largest weight (here
``site-a``'s 4, :data:`UNIT`): the mean is ``S · unit / Σ w``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from fedshard.aggregation import error_bound
from fedshard.errors import PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import build_manifest
from fedshard.protocol.rounds import GLOBAL_GROUP, PartialEntry, PartialSum, RoundSpec
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.frames import shard_chunks
from tests.zone_helpers import (
    BASE,
    FORWARD_WEIGHTS,
    SMALL_PLAN,
    TOKEN,
    Shards,
    partial_from,
    random_update,
    reducing_policy,
)

SITES = ("site-a", "site-b")
UNIT = max(w for _, w in FORWARD_WEIGHTS)
PLAN = SMALL_PLAN


def sums(seed: int) -> Shards:
    rng = np.random.default_rng(seed)
    return {sid: rng.standard_normal(PLAN.shard(sid).shape) for sid in PLAN.shard_ids}


@pytest.fixture
def zone() -> ZoneAggregator:
    zone = ZoneAggregator("eu-1", "EU", residency=reducing_policy(PLAN, SITES))
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=FORWARD_WEIGHTS))
    return zone


def assert_only_good_counted(zone: ZoneAggregator) -> None:
    good = sums(99)
    assert zone.receive_partial(partial_from(good, weight=4.0), good) == len(good)
    # the forward was staged in the zone's reused buffers, all given back for the next push or forward
    assert (zone.round_state.staging.lent, zone.round_state.staging.free) == (0, sum(v.nbytes for v in good.values()))
    (summary,) = zone.close_round(1)
    aggregate = zone.fetch(1, GLOBAL_GROUP, jurisdiction="EU").means

    assert (summary.group, summary.sites, summary.total_weight) == (GLOBAL_GROUP, ("site-a",), 4.0)
    assert zone.stats.partials_received == len(good)
    for sid, total in good.items():
        np.testing.assert_array_equal(aggregate[sid], (total * UNIT / 4.0).astype(np.float32))


def refused(zone: ZoneAggregator, code: RefusalCode, match: str, forward: Callable[[], object]) -> None:
    with pytest.raises(PushRejectedError, match=match) as info:
        forward()

    assert info.value.code is code
    assert zone.round_state.staging.lent == 0  # a refused forward gives its staging buffers back too
    assert str(info.value).startswith("zone eu-1 refused zone us-1's partial sums for round 1: ")
    assert "\n" not in str(info.value)
    assert_only_good_counted(zone)


def test_forwarded_sums_make_the_global_mean(zone: ZoneAggregator) -> None:
    assert_only_good_counted(zone)


def test_forwarded_sums_and_a_local_push_make_one_global_mean(zone: ZoneAggregator) -> None:
    assert zone.residency is not None
    local = random_update(5, PLAN)
    manifest = build_manifest(
        site_id="site-b",
        round=1,
        plan_digest=PLAN.digest,
        base_version=BASE,
        zone="eu-1",
        weight=2.0,
        shards=local,
        classes=dict.fromkeys(local, "public"),
        policy_digest=zone.residency.policy.digest,
    )
    forwarded = sums(7)

    zone.push(manifest, TOKEN, local)
    zone.receive_partial(partial_from(forwarded, weight=4.0), forwarded)
    (summary,) = zone.close_round(1)
    aggregate = zone.fetch(1, GLOBAL_GROUP, jurisdiction="US").means

    assert (summary.sites, summary.total_weight) == (("site-a", "site-b"), 6.0)
    for sid in PLAN.shard_ids:
        expected = (UNIT * forwarded[sid] + 2.0 * local[sid].astype(np.float64)) / 6.0
        magnitude = (UNIT * np.abs(forwarded[sid]) + 2.0 * np.abs(local[sid].astype(np.float64))) / 6.0
        assert np.all(np.abs(aggregate[sid] - expected) <= error_bound(2, magnitude))


def test_a_tampered_sum_is_refused_on_its_digest(zone: ZoneAggregator) -> None:
    a = sums(1)
    partial = partial_from(a)
    a["w#r0c0"] = a["w#r0c0"] + 1.0

    refused(
        zone,
        RefusalCode.DIGEST,
        "shard w#r0c0: digest does not match the header",
        lambda: zone.receive_partial(partial, a),
    )


def test_a_sum_the_header_does_not_list_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    partial = partial_from({k: v for k, v in a.items() if k != "b#r1c0"})

    refused(
        zone, RefusalCode.UNKNOWN_SHARD, "b#r1c0 is not listed in the header", lambda: zone.receive_partial(partial, a)
    )


def test_a_listed_sum_that_never_arrives_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    partial = partial_from(a)
    del a["w#r1c1"]

    refused(zone, RefusalCode.MISSING, "never arrived, e.g. w#r1c1", lambda: zone.receive_partial(partial, a))


def test_a_sum_of_another_shape_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    partial = partial_from(a)
    a["w#r0c0"] = a["w#r0c0"].reshape(2, 8)

    refused(
        zone,
        RefusalCode.SHAPE,
        r"w#r0c0 has shape \(2, 8\), the header says \(4, 4\)",
        lambda: zone.receive_partial(partial, a),
    )


def test_float32_sums_are_accepted(zone: ZoneAggregator) -> None:
    a = {sid: v.astype(np.float32) for sid, v in sums(1).items()}
    assert zone.receive_partial(partial_from(a, weight=4.0), a) == len(a)
    zone.close_round(1)
    aggregate = zone.fetch(1, GLOBAL_GROUP, jurisdiction="EU").means
    for sid, total in a.items():
        np.testing.assert_array_equal(aggregate[sid], total)  # S · unit / Σ w with unit = Σ w


def test_sums_of_another_width_are_refused(zone: ZoneAggregator) -> None:
    a = {sid: v.astype(np.float16) for sid, v in sums(1).items()}
    refused(
        zone, RefusalCode.SHAPE, "partial sums are float32 or float64", lambda: zone.receive_partial(partial_from(a), a)
    )


def test_non_finite_sums_are_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    a["b#r0c0"][0, 0] = np.nan
    refused(zone, RefusalCode.NON_FINITE, "b#r0c0: non-finite", lambda: zone.receive_partial(partial_from(a), a))


def test_a_non_positive_weight_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    refused(
        zone,
        RefusalCode.NON_FINITE,
        "non-finite values or weight",
        lambda: zone.receive_partial(partial_from(a, weight=0.0), a),
    )


def test_a_stale_token_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    refused(zone, RefusalCode.TOKEN, "round token", lambda: zone.receive_partial(partial_from(a, token="old"), a))


def test_a_header_listing_a_shard_twice_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    partial = partial_from(a)
    partial = replace(partial, entries=(*partial.entries, partial.entries[0]))
    refused(zone, RefusalCode.MALFORMED, "lists a shard twice", lambda: zone.receive_partial(partial, a))


def test_a_sum_of_no_site_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    refused(
        zone,
        RefusalCode.MALFORMED,
        "a partial sum of no site",
        lambda: zone.receive_partial(partial_from(a, sites=()), a),
    )


def test_a_sum_naming_an_unknown_site_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    refused(
        zone,
        RefusalCode.IDENTITY,
        "unknown site 'site-z'",
        lambda: zone.receive_partial(partial_from(a, sites=("site-z",)), a),
    )


def test_a_caller_whose_certificate_names_another_zone_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    refused(
        zone,
        RefusalCode.IDENTITY,
        "certificate names zone 'ap-1'",
        lambda: zone.receive_partial(partial_from(a), a, certified="ap-1"),
    )


def test_a_second_forward_of_the_same_zone_is_refused(zone: ZoneAggregator) -> None:
    a, b = sums(1), sums(2)
    zone.receive_partial(partial_from(a, weight=4.0), a)

    with pytest.raises(PushRejectedError, match="already forwarded") as info:
        zone.receive_partial(partial_from(b), b)

    assert info.value.code is RefusalCode.DUPLICATE
    (summary,) = zone.close_round(1)
    assert summary.total_weight == 4.0


def test_a_forward_while_the_same_zone_is_forwarding_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    with zone.begin_forward(partial_from(a), certified=None) as session:
        with pytest.raises(PushRejectedError, match="already forwarded") as info:
            zone.begin_forward(partial_from(a))
        session.take(next(shard_chunks("w#r0c0", a["w#r0c0"])))

    assert info.value.code is RefusalCode.DUPLICATE
    assert_only_good_counted(zone)


def test_a_forward_after_the_round_closed_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    zone.close_round(1)

    with pytest.raises(PushRejectedError, match="round 1 is not open") as info:
        zone.receive_partial(partial_from(a), a)

    assert info.value.code is RefusalCode.ROUND


def test_every_refusal_is_counted_and_audited(zone: ZoneAggregator) -> None:
    a = sums(1)
    partial = partial_from(a)
    a["w#r0c0"] = a["w#r0c0"] + 1.0

    with pytest.raises(PushRejectedError):
        zone.receive_partial(partial, a)

    assert zone.stats.refused == 1
    assert "digest does not match the header" in zone.stats.refusals[-1]


def test_a_zone_without_residency_reduces_nothing() -> None:
    zone = ZoneAggregator("eu-1", "EU")
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES))
    a = sums(1)

    with pytest.raises(PushRejectedError, match="reduces nothing globally") as info:
        zone.receive_partial(partial_from(a), a)

    assert info.value.code is RefusalCode.RESIDENCY


def test_an_encrypted_sum_needs_a_zone_with_a_ckks_context(zone: ZoneAggregator) -> None:
    blob = b"\x00" * 64
    entry = PartialEntry("w#r0c0", "00" * 32, 64, 1.0, ("site-a",), encrypted=True)

    refused(
        zone,
        RefusalCode.ENCRYPTION,
        "not an encrypted partial sum this zone sums",
        lambda: zone.receive_partial(PartialSum("us-1", 1, TOKEN, (entry,)), {"w#r0c0": blob}),
    )


# contributors and weights: what the round fixed ------------------------------------------------


def test_a_sum_naming_a_site_that_pushes_to_another_zone_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)  # site-b is in the EU: its shards come to eu-1 itself, never through us-1
    refused(
        zone,
        RefusalCode.RESIDENCY,
        "names site site-b, which pushes that shard to zone eu-1, not to us-1",
        lambda: zone.receive_partial(partial_from(a, sites=("site-b",), weight=2.0), a),
    )


def test_a_sum_naming_a_site_not_selected_for_the_round_is_refused() -> None:
    policy = reducing_policy(PLAN, (*SITES, "site-x"), us_sites=("site-a", "site-x"))
    zone = ZoneAggregator("eu-1", "EU", residency=policy)
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=FORWARD_WEIGHTS))
    a = sums(1)
    refused(
        zone,
        RefusalCode.SITE,
        "names site 'site-x', which was not selected for this round",
        lambda: zone.receive_partial(partial_from(a, sites=("site-a", "site-x"), weight=5.0), a),
    )


@pytest.mark.parametrize("weight", [5.0, 1e9, 1e308])
def test_a_sum_whose_weight_is_not_the_rounds_is_refused(zone: ZoneAggregator, weight: float) -> None:
    a = sums(1)
    refused(
        zone,
        RefusalCode.WEIGHT,
        "differs from 4, the round's weights of the sites it names",
        lambda: zone.receive_partial(partial_from(a, weight=weight), a),
    )


def test_a_sum_naming_a_site_twice_is_refused(zone: ZoneAggregator) -> None:
    a = sums(1)
    refused(
        zone,
        RefusalCode.MALFORMED,
        "names a site twice",
        lambda: zone.receive_partial(partial_from(a, sites=("site-a", "site-a"), weight=8.0), a),
    )


def test_the_weight_of_a_sum_of_several_sites_is_the_sum_of_theirs() -> None:
    policy = reducing_policy(PLAN, ("site-a", "site-b", "site-x"), us_sites=("site-a", "site-x"))
    zone = ZoneAggregator("eu-1", "EU", residency=policy)
    weights = (("site-a", 4.0), ("site-x", 0.1), ("site-b", 2.0))
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a", "site-b", "site-x"), weights=weights))
    a = sums(1)
    assert zone.receive_partial(partial_from(a, sites=("site-a", "site-x"), weight=0.1 + 4.0), a) == len(a)
    (summary,) = zone.close_round(1)
    assert summary.total_weight == pytest.approx(4.1)


@pytest.mark.parametrize("value", [1e4 * 1.001, 1e308])
def test_a_sum_beyond_its_weight_times_max_value_is_refused(zone: ZoneAggregator, value: float) -> None:
    a = sums(1)
    a["w#r1c1"][0, 0] = value  # Σ (w/unit)·x with Σ w = unit = 4 and |x| ≤ 1e4 reaches 1e4 at most
    refused(
        zone,
        RefusalCode.BOUND,
        r"shard w#r1c1: partial sum values reach .*, beyond Σ w / unit weight · aggregation.max_value = 1e\+04",
        lambda: zone.receive_partial(partial_from(a), a),
    )


def test_a_sum_at_its_bound_is_accepted(zone: ZoneAggregator) -> None:
    a = {sid: np.full(PLAN.shard(sid).shape, -1e4) for sid in PLAN.shard_ids}
    assert zone.receive_partial(partial_from(a), a) == len(a)


class _Link:
    """A zone client of ``zone`` (forwards only) that fails while ``up`` is false."""

    def __init__(self, zone: ZoneAggregator, up: bool) -> None:
        self.zone, self.up = zone, up

    def forward(self, partial: PartialSum, values: Shards) -> int:
        if not self.up:
            raise ZoneError("zone eu-1 at 127.0.0.1:9 is unreachable", RefusalCode.FAILED)
        return self.zone.receive_partial(partial, values, certified=partial.zone)

    def close(self) -> None:
        pass


def test_a_close_whose_forward_fails_keeps_the_round_for_a_retry(zone: ZoneAggregator) -> None:
    assert zone.residency is not None
    link = _Link(zone, up=False)
    dialled: list[tuple[str, str]] = []

    def connect(name: str, endpoint: str) -> _Link:
        dialled.append((name, endpoint))
        return link

    us = ZoneAggregator(
        "us-1",
        "US",
        residency=replace(zone.residency, zone="us-1", region="US"),
        connect=connect,  # type: ignore[arg-type]
        peers={"eu-1": "10.0.0.1:9201", "us-1": "10.0.0.2:9201"},  # the zone's own config
    )
    us.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=FORWARD_WEIGHTS))
    update = random_update(3, PLAN)
    manifest = build_manifest(
        site_id="site-a",
        round=1,
        plan_digest=PLAN.digest,
        base_version=BASE,
        zone="us-1",
        weight=4.0,
        shards=update,
        classes=dict.fromkeys(update, "public"),
        policy_digest=zone.residency.policy.digest,
    )
    us.push(manifest, TOKEN, update)

    with pytest.raises(ZoneError, match="unreachable"):
        us.close_round(1)
    # a coordinator naming another zone, or another endpoint for the reducing zone, is refused: nothing dialled
    for target in (("us-2", "10.0.0.1:9201"), ("eu-1", "127.0.0.1:9"), ("us-1", "10.0.0.2:9201")):
        with pytest.raises(ZoneError, match=r"own config \(eu-1 at 10.0.0.1:9201\)") as info:
            us.close_round(1, forward_to=target)
        assert info.value.code is RefusalCode.AUTHORITY
    assert dialled == [("eu-1", "10.0.0.1:9201")]
    link.up = True
    assert us.close_round(1, forward_to=("eu-1", "10.0.0.1:9201")) == []  # the round was kept: the retry forwards it
    assert dialled == [("eu-1", "10.0.0.1:9201")] * 2
    (summary,) = zone.close_round(1)
    assert summary.sites == ("site-a",) and summary.total_weight == 4.0
    aggregate = zone.fetch(1, GLOBAL_GROUP, jurisdiction="US").means
    for sid, values in update.items():
        np.testing.assert_allclose(aggregate[sid], values, rtol=1e-6)
