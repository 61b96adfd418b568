"""Unit tests of the zone's staging pool (:mod:`fedshard.zone._staging`) and of pushes staged in it.

A push's clear shards are copied into buffers the zone reuses from push to push; these
tests check that the buffers are reused, bounded, given back however a push ends, and
that reusing them never changes what is counted.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedshard.errors import PushRejectedError, RefusalCode
from fedshard.protocol.rounds import DEFAULT_GROUP, RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone._staging import ByteBudget, StagingPool
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.frames import Chunk, Declared, FrameAssembler, Header, shard_chunks
from tests import zone_helpers
from tests.zone_helpers import BASE, TOKEN, Shards, assert_weighted_mean, random_update

ZONE = "eu-1"
WEIGHTS = {"site-a": 1.0, "site-b": 3.0, "site-c": 2.0}
# w (6, 8) -> shards of (4, 4) and (2, 4); b (5,) -> (4,) and (1,): four sizes of buffer
PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32), "b": np.zeros(5, np.float32)}, tile=(4, 4))


def open_zone(staging_bytes: int = 256 << 20) -> ZoneAggregator:
    zone = ZoneAggregator(ZONE, "EU", staging_bytes=staging_bytes)
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, tuple(WEIGHTS), weights=tuple(WEIGHTS.items())))
    return zone


def push(zone: ZoneAggregator, site: str, shards: Shards) -> None:
    manifest = zone_helpers.manifest_for(site, shards, plan=PLAN, zone=ZONE, weight=WEIGHTS[site])
    zone.push(manifest, TOKEN, shards)


def sums_of(zone: ZoneAggregator) -> dict[str, tuple[np.ndarray, float]]:
    """Round 1's running sums ``S`` and ``Σ w`` per shard (one aggregate group: no residency policy)."""
    return zone.round_state.open[1].groups[DEFAULT_GROUP].partial_sums()


def assert_mean_of(zone: ZoneAggregator, updates: dict[str, Shards]) -> None:
    """Close round 1 and check its aggregate is the weighted mean of exactly ``updates`` (site → shards)."""
    summary = zone.close_round(1)[0]
    means = zone.fetch(1).means
    assert summary.sites == tuple(updates)
    for sid in PLAN.shard_ids:
        assert_weighted_mean(means[sid], [u[sid] for u in updates.values()], [WEIGHTS[s] for s in updates])


# the pool ------------------------------------------------------------------------------------------


def test_a_buffer_given_back_is_taken_again() -> None:
    pool = StagingPool(100)

    first = pool.take(64)
    assert (pool.lent, pool.free) == (64, 0)
    assert pool.give([first]) == 0
    assert (pool.lent, pool.free) == (0, 64)

    assert pool.take(64) is first
    assert pool.take(64) is not first  # none of that size left: a new one
    assert pool.allocated == 2


def test_the_pool_keeps_at_most_its_capacity() -> None:
    pool = StagingPool(100)
    buffers = [pool.take(40) for _ in range(3)]  # 120 lent: a push larger than the budget gets it all

    assert pool.give(buffers) == 40  # only two fit the capacity again
    assert (pool.lent, pool.free) == (0, 80)


def test_a_new_size_drops_free_buffers_of_other_sizes_to_fit() -> None:
    pool = StagingPool(100)
    pool.give([pool.take(60)])

    pool.take(50)

    assert (pool.lent, pool.free) == (50, 0)
    assert pool.allocated == 2


def test_zero_size_buffers_are_not_pooled() -> None:
    pool = StagingPool(100)
    empty = pool.take(0)

    assert empty.nbytes == 0
    assert pool.give([empty]) == 0
    assert (pool.lent, pool.free, pool.allocated) == (0, 0, 0)


def test_the_assembler_copies_a_whole_shard_into_a_buffer_and_stages_it_read_only() -> None:
    pool = StagingPool(1 << 10)
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    declared = {"s": Declared("s", values.nbytes, None, "<f4", (3, 4), Header.PLAN)}
    frames = FrameAssembler(declared, source=Header.MANIFEST, buffers=pool.take)
    received = values.tobytes()

    done = frames.add(Chunk("s", 0, received, "<f4", (3, 4)))

    assert done is not None
    staged = done[1]
    assert isinstance(staged, np.ndarray)
    np.testing.assert_array_equal(staged, values)
    assert not np.shares_memory(staged, np.frombuffer(received, np.uint8))  # the frame's bytes can go
    assert not staged.flags.writeable
    assert pool.lent == values.nbytes


# pushes staged in the pool -------------------------------------------------------------------------


def test_pushes_that_follow_each_other_reuse_the_staging_buffers() -> None:
    zone = open_zone()
    a, b = random_update(1, PLAN), random_update(2, PLAN)

    push(zone, "site-a", a)
    pool = zone.round_state.staging
    allocated = pool.allocated
    assert allocated == len(PLAN)
    assert (pool.lent, pool.free) == (0, PLAN.nbytes)

    push(zone, "site-b", b)

    assert pool.allocated == allocated
    assert (pool.lent, pool.free) == (0, PLAN.nbytes)
    assert_mean_of(zone, {"site-a": a, "site-b": b})


def test_the_staging_pool_is_bounded_by_the_budget() -> None:
    budget = PLAN.nbytes - 1  # one push is let through alone, but cannot all be kept
    zone = open_zone(staging_bytes=budget)
    a = random_update(1, PLAN)

    push(zone, "site-a", a)

    assert zone.round_state.staging.lent == 0
    assert 0 < zone.round_state.staging.free <= budget
    assert zone.round_state.budget._used == 0


def test_an_aborted_push_gives_its_buffers_back() -> None:
    zone = open_zone()
    a, c = random_update(1, PLAN), random_update(3, PLAN)
    manifest = zone_helpers.manifest_for("site-a", a, plan=PLAN, zone=ZONE, weight=WEIGHTS["site-a"])
    sids = list(a)

    with zone.begin_push(manifest, TOKEN) as session:
        for chunk in shard_chunks(sids[0], a[sids[0]]):
            session.take(chunk)
        session.take(next(shard_chunks(sids[1], a[sids[1]], chunk_bytes=8)))  # a shard half received
        assert zone.round_state.staging.lent == a[sids[0]].nbytes + a[sids[1]].nbytes

    assert zone.round_state.staging.lent == 0
    assert zone.round_state.budget._used == 0
    push(zone, "site-c", c)
    assert_mean_of(zone, {"site-c": c})


def test_a_refused_push_gives_its_buffers_back_and_leaves_the_sums_untouched() -> None:
    zone = open_zone()
    a, b, c = random_update(1, PLAN), random_update(2, PLAN), random_update(3, PLAN)
    push(zone, "site-a", a)
    before = {sid: (total.copy(), w) for sid, (total, w) in sums_of(zone).items()}
    bad = {sid: v.copy() for sid, v in b.items()}
    bad[list(b)[-1]].flat[0] = np.nan  # the last shard: every other was staged first

    with pytest.raises(PushRejectedError) as info:
        push(zone, "site-b", bad)

    assert info.value.code == RefusalCode.NON_FINITE
    assert zone.round_state.staging.lent == 0
    after = sums_of(zone)
    assert set(after) == set(before)
    for sid, (total, weight) in before.items():
        np.testing.assert_array_equal(after[sid][0], total)
        assert after[sid][1] == weight
    push(zone, "site-c", c)  # into the buffers the refused push filled
    assert zone.round_state.staging.allocated == len(PLAN)
    assert_mean_of(zone, {"site-a": a, "site-c": c})


def test_the_sums_do_not_share_memory_with_the_staging_buffers() -> None:
    zone = open_zone()
    a = random_update(1, PLAN)
    push(zone, "site-a", a)
    pool = zone.round_state.staging

    reused = [pool.take(v.nbytes) for v in a.values()]  # what the next push would be staged in
    for buf in reused:
        buf.view(np.uint8)[:] = 0xFF  # NaN as float32
    pool.give(reused)

    assert_mean_of(zone, {"site-a": a})


# the budget ----------------------------------------------------------------------------------------


def test_bytes_kept_in_the_pool_do_not_count_towards_a_heap_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr("fedshard.zone._staging.release_free_memory", lambda: trims.append(1) or True)
    budget = ByteBudget(100)

    for _ in range(5):  # 40 in use each time, none of it freed
        assert budget.acquire(40)
        budget.release(40, freed=0)
    assert trims == []

    budget.release(0, freed=80)  # 80 freed + 40 in use > 100: the next acquire trims
    assert budget.acquire(40)
    assert trims == [1]
