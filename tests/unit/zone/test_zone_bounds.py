"""Weights and values a zone folds are bounded by what the coordinator and the config fix.

Every refusal leaves nothing counted (:func:`only_good_counted`); every clip is checked
against the exact aggregate it must produce.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from fedshard.aggregation import ShardAccumulator, error_bound, extremes, norm_scale, squared_norm
from fedshard.audit import AuditLog
from fedshard.config import AggregationConfig, BoundRule
from fedshard.errors import PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import shard_digest
from fedshard.protocol.rounds import RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from tests import zone_helpers
from tests.zone_helpers import BASE, TOKEN, Shards

ZONE = "eu-1"
SITES = ("site-a", "site-b", "site-c")
WEIGHTS = {"site-a": 100.0, "site-b": 100.0, "site-c": 50.0}
PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32), "b": np.zeros(5, np.float32)}, tile=(4, 4))


def update(value: float | None = None, seed: int = 0) -> Shards:
    """Random values (or every value ``value``), split by PLAN."""
    if value is None:
        return zone_helpers.random_update(seed, PLAN)
    return {sid: np.full(PLAN.shard(sid).shape, value, np.float32) for sid in PLAN.shard_ids}


def manifest(site: str, shards: Shards, weight: float | None = None):  # type: ignore[no-untyped-def]
    w = WEIGHTS[site] if weight is None else weight
    return zone_helpers.manifest_for(site, shards, plan=PLAN, zone=ZONE, weight=w)


def open_zone(**bounds: object) -> ZoneAggregator:
    zone = ZoneAggregator(ZONE, "EU", bounds=AggregationConfig.model_validate(bounds))
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))
    return zone


def only_good_counted(zone: ZoneAggregator) -> None:
    """site-c pushes an honest update (within every bound the tests set); the aggregate is
    exactly it, at its fixed weight."""
    good = {sid: v / 1000 for sid, v in update(seed=99).items()}
    zone.push(manifest("site-c", good), TOKEN, good)
    (summary,) = zone.close_round(1)
    assert summary.sites == ("site-c",)
    assert summary.total_weight == WEIGHTS["site-c"]
    means = zone.fetch(1).means
    for sid, values in good.items():
        np.testing.assert_array_equal(means[sid], values)


def refused(zone: ZoneAggregator, code: RefusalCode, match: str, site: str, shards: Shards, **kw: float) -> None:
    with pytest.raises(PushRejectedError, match=match) as info:
        zone.push(manifest(site, shards, **kw), TOKEN, shards)
    assert info.value.code is code
    assert "\n" not in str(info.value)
    only_good_counted(zone)


# weights fixed by the round -------------------------------------------------------------------


@pytest.mark.parametrize("weight", [1e9, 1e308, 100.5, 99.99999999])
def test_a_manifest_weight_other_than_the_rounds_is_refused(weight: float) -> None:
    zone = open_zone()
    shards = update(seed=1)
    refused(zone, RefusalCode.WEIGHT, "the weight the round fixed for the site", "site-a", shards, weight=weight)


def test_sites_weigh_what_the_round_fixed() -> None:
    zone = open_zone()
    a, b = update(seed=1), update(seed=2)
    zone.push(manifest("site-a", a), TOKEN, a)
    zone.push(manifest("site-c", b), TOKEN, b)
    (summary,) = zone.close_round(1)
    assert summary.total_weight == 150.0
    means = zone.fetch(1).means
    for sid in PLAN.shard_ids:
        expected = (100.0 * a[sid].astype(np.float64) + 50.0 * b[sid].astype(np.float64)) / 150.0
        magnitude = (100.0 * np.abs(a[sid].astype(np.float64)) + 50.0 * np.abs(b[sid].astype(np.float64))) / 150.0
        assert np.all(np.abs(means[sid] - expected) <= error_bound(2, magnitude))  # float32 sums: the stated bound


def test_a_site_the_round_names_no_weight_for_weighs_one() -> None:
    zone = ZoneAggregator(ZONE, "EU")
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES))
    a = update(seed=1)
    with pytest.raises(PushRejectedError) as info:
        zone.push(manifest("site-a", a, weight=30.0), TOKEN, a)
    assert info.value.code is RefusalCode.WEIGHT
    zone.push(manifest("site-a", a, weight=1.0), TOKEN, a)
    assert zone.close_round(1)[0].total_weight == 1.0


@pytest.mark.parametrize(
    ("weights", "code", "match"),
    [
        ((("site-a", 2e6),), RefusalCode.BOUND, "at most aggregation.max_site_weight = 1e\\+06"),
        ((("site-a", math.inf),), RefusalCode.BOUND, "fixes weight inf"),
        ((("site-a", 0.0),), RefusalCode.BOUND, "positive"),
        ((("site-z", 1.0),), RefusalCode.INVALID, "site 'site-z', which it did not select"),
    ],
)
def test_a_round_whose_weights_break_the_zones_bounds_is_refused(
    weights: tuple[tuple[str, float], ...], code: RefusalCode, match: str
) -> None:
    zone = ZoneAggregator(ZONE, "EU")
    with pytest.raises(ZoneError, match=match) as info:
        zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=weights))
    assert info.value.code is code
    a = update(seed=1)
    with pytest.raises(PushRejectedError) as pushed:  # the round was not opened
        zone.push(manifest("site-a", a, weight=1.0), TOKEN, a)
    assert pushed.value.code is RefusalCode.ROUND


# values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1e5, -3e38])
def test_a_value_beyond_max_value_is_refused_by_default(value: float) -> None:
    zone = open_zone()
    shards = update(seed=1)
    shards["w#r0c1"][1, 2] = value
    refused(zone, RefusalCode.BOUND, "shard w#r0c1 holds a value of magnitude .* above aggregation.max_value = 10000",
            "site-a", shards)  # fmt: skip


def test_values_beyond_max_value_are_clipped_under_the_clip_rule() -> None:
    zone = open_zone(max_value=2.0, value_rule="clip")
    shards = update(seed=1)
    shards["b#r0c0"][:] = 7.0
    shards["w#r0c0"][0, 0] = -1e30
    zone.push(manifest("site-a", shards), TOKEN, shards)
    zone.close_round(1)
    means = zone.fetch(1).means
    for sid, values in shards.items():
        np.testing.assert_array_equal(means[sid], np.clip(values, -2.0, 2.0))


def test_a_tampered_shard_is_refused_on_its_digest_before_any_clip() -> None:
    zone = open_zone(max_value=2.0, value_rule="clip", max_update_norm=1.0)
    shards = update(10.0)
    signed = manifest("site-a", shards)
    shards["w#r0c0"] = shards["w#r0c0"] * 2
    with pytest.raises(PushRejectedError) as info:
        zone.push(signed, TOKEN, shards)
    assert info.value.code is RefusalCode.DIGEST
    only_good_counted(zone)


def test_the_largest_weights_and_values_of_many_sites_sum_to_a_finite_mean() -> None:
    # W·V·N with the largest bounds a config may set: 1e15 · 1e15 · 200 sites = 2e32
    sites = tuple(f"s{i}" for i in range(200))
    zone = ZoneAggregator(ZONE, "EU", bounds=AggregationConfig(max_site_weight=1e15, max_value=1e15))
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, sites, weights=tuple((s, 1e15) for s in sites)))
    for i, site in enumerate(sites):
        shards = update(1e15 if i % 3 else -1e15)
        zone.push(zone_helpers.manifest_for(site, shards, plan=PLAN, zone=ZONE, weight=1e15), TOKEN, shards)
    (summary,) = zone.close_round(1)
    assert summary.total_weight == 2e17
    for values in zone.fetch(1).means.values():
        assert np.isfinite(values).all() and np.abs(values).max() <= 1e15


def test_scaled_float32_sums_of_bounded_terms_cannot_overflow() -> None:
    # the bound the config states: |S| = |Σ (w/unit)·x| ≤ N·V; here N = 1000 terms of the
    # largest weight and value (10^15 each), which unscaled (Σ w x = 10^33) would not fit float32
    acc = ShardAccumulator(unit=1e15, sites=1000)
    worst = np.full(8, np.float32(1e15))
    for _ in range(1000):
        acc.add("s", worst, 1e15)
    (total, weight) = acc.partial_sums()["s"]
    assert total.dtype == np.float32
    assert np.isfinite(total).all() and total.max() <= 1000 * 1e15 * (1 + 1e-4)
    assert weight == 1e18
    np.testing.assert_allclose(acc.finalize()["s"], worst, rtol=1e-4)
    # and what the scaling is for: one unscaled term of W·V = 10^30 times 10^9 is infinite in float32
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.float32(1e30) * np.float32(1e9))


# norm ----------------------------------------------------------------------------------------------


def test_an_update_above_the_norm_bound_is_scaled_down_to_it() -> None:
    zone = open_zone(max_update_norm=2.0, max_norm_over_median=None)  # 500x site-c's: no relative check
    big = update(seed=1)
    norm = math.sqrt(sum(squared_norm(v) for v in big.values()))
    assert norm > 2.0
    small = {sid: v / 1000 for sid, v in update(seed=2).items()}  # within the bound: as it is
    zone.push(manifest("site-a", big), TOKEN, big)
    zone.push(manifest("site-c", small), TOKEN, small)
    (summary,) = zone.close_round(1)
    assert summary.total_weight == 150.0  # clipping scales values, never the weight
    means = zone.fetch(1).means
    for sid in PLAN.shard_ids:
        expected = (100.0 * (2.0 / norm) * big[sid].astype(np.float64) + 50.0 * small[sid].astype(np.float64)) / 150
        np.testing.assert_allclose(means[sid], expected, rtol=1e-5, atol=1e-7)


def test_the_clip_is_audited(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    zone = ZoneAggregator(ZONE, "EU", audit=audit, bounds=AggregationConfig(max_update_norm=1.0))
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))
    shards = update(3.0)
    zone.push(manifest("site-a", shards), TOKEN, shards)
    zone.close()
    norm = math.sqrt(sum(squared_norm(v) for v in shards.values()))
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    (accepted,) = [r for r in records if r.get("site") == "site-a"]
    assert accepted["norm_scale"] == pytest.approx(1.0 / norm)


def test_an_update_above_the_norm_bound_is_refused_under_the_refuse_rule() -> None:
    zone = open_zone(max_update_norm=2.0, norm_rule="refuse")
    refused(zone, RefusalCode.BOUND, "L2 norm at this zone exceeds its bound 2 ", "site-a",
            update(seed=1))  # fmt: skip


def test_an_update_within_the_norm_bound_is_folded_as_it_is() -> None:
    zone = open_zone(max_update_norm=1e6, norm_rule="refuse")
    a = update(seed=1)
    zone.push(manifest("site-a", a), TOKEN, a)
    zone.close_round(1)
    means = zone.fetch(1).means
    for sid, values in a.items():
        np.testing.assert_array_equal(means[sid], values)
        assert shard_digest(means[sid]) == shard_digest(values)


# helpers and config --------------------------------------------------------------------------------


def test_extremes_and_norms() -> None:
    values = np.array([[1.0, -4.0], [2.0, 0.5]], np.float32)
    assert extremes(values) == (-4.0, 2.0)
    assert extremes(np.zeros((0, 3), np.float32)) == (0.0, 0.0)
    assert math.isnan(extremes(np.array([1.0, np.nan], np.float32))[1])
    assert squared_norm(values) == 21.25
    assert squared_norm(np.full(4, 60000, np.float16)) == 4 * 60000.0**2  # no float16 overflow
    assert squared_norm(np.full(4, 1e30, np.float32)) == pytest.approx(4e60)  # float32 overflow: taken in float64
    assert norm_scale(16.0, 8.0) == 1.0 and norm_scale(16.0, 2.0) == 0.5


def test_aggregation_config_defaults_and_limits() -> None:
    config = AggregationConfig()
    assert (config.max_site_weight, config.max_value, config.max_update_norm) == (1e6, 1e4, None)
    assert (config.value_rule, config.norm_rule) == (BoundRule.REFUSE, BoundRule.CLIP)
    assert config.fixed_weight(30) == 30.0 and config.fixed_weight(10**9) == 1e6 and config.fixed_weight(0) == 1.0
    for bad in ({"max_site_weight": 1e16}, {"max_site_weight": 0.5}, {"max_value": 0}, {"max_value": 1e300},
                {"max_update_norm": -1}, {"norm_rule": "ignore"}, {"max_weight": 5}):  # fmt: skip
        with pytest.raises(ValidationError):
            AggregationConfig.model_validate(bad)


# The zone's own norm reference (aggregation.max_norm_over_median, default 10): no bound configured.


def _push_round(zone: ZoneAggregator, rnd: int, scales: dict[str, float], only: tuple[str, ...] = ()) -> None:
    zone.open_round(RoundSpec(rnd, TOKEN, PLAN.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))
    for i, (site, scale) in enumerate(scales.items()):
        shards = {sid: v * np.float32(scale) for sid, v in update(seed=10 * rnd + i).items()}
        if only:
            shards = {sid: v for sid, v in shards.items() if sid in only}
        m = zone_helpers.manifest_for(site, shards, plan=PLAN, zone=ZONE, weight=WEIGHTS[site], round=rnd)
        zone.push(m, TOKEN, shards)


def _norm(shards: Shards) -> float:
    return math.sqrt(sum(squared_norm(v) for v in shards.values()))


def test_from_its_second_round_a_zone_clips_an_update_far_above_its_median(tmp_path: Path) -> None:
    zone = ZoneAggregator(ZONE, "EU", audit=AuditLog(tmp_path / "audit.jsonl"))
    _push_round(zone, 1, {"site-a": 1.0, "site-b": 1.0, "site-c": 1.0})
    zone.close_round(1)
    first = sorted(_norm(update(seed=10 + i)) for i in range(3))
    _push_round(zone, 2, {"site-a": 1.0, "site-b": 3.0, "site-c": 1000.0})  # within 10x, and far above
    zone.close_round(2)
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    second = {r["site"]: r for r in records if r["decision"] == "accepted" and r["round"] == 2}
    assert "norm_scale" not in second["site-a"] and "norm_scale" not in second["site-b"]
    assert second["site-c"]["norm"] == pytest.approx(10 * first[1], rel=1e-5)  # 10x the lower median
    assert second["site-c"]["norm_scale"] == pytest.approx(10 * first[1] / (1000 * _norm(update(seed=22))), rel=1e-5)


def test_a_first_round_with_an_update_far_above_its_median_is_not_published() -> None:
    zone = ZoneAggregator(ZONE, "EU")
    _push_round(zone, 1, {"site-a": 1.0, "site-b": 1.0, "site-c": 1000.0})
    with pytest.raises(ZoneError) as refused:
        zone.close_round(1)
    assert refused.value.code is RefusalCode.BOUND and "site site-c's update norm" in str(refused.value)
    assert "\n" not in str(refused.value) and zone.stats.refused == 1
    zone.abort_round(1)  # what the coordinator does: nothing of round 1 is published
    _push_round(zone, 2, {"site-a": 1.0, "site-b": 1.0, "site-c": 1000.0})
    (summary,) = zone.close_round(2)  # the outlier is clipped now: the round publishes
    assert set(summary.sites) == set(SITES)
    mean = zone.fetch(2).means
    assert max(float(np.abs(v).max()) for v in mean.values()) < 50  # not the x1000 update


def test_a_shard_set_one_site_alone_pushes_is_compared_with_its_own_rounds_only() -> None:
    zone = ZoneAggregator(ZONE, "EU")
    alone = tuple(PLAN.shard_ids[:1])
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))
    for site, scale, only in (("site-a", 1.0, ()), ("site-b", 1.0, ()), ("site-c", 1000.0, alone)):
        shards = {sid: v * np.float32(scale) for sid, v in update(seed=1).items() if not only or sid in only}
        zone.push(zone_helpers.manifest_for(site, shards, plan=PLAN, zone=ZONE, weight=WEIGHTS[site]), TOKEN, shards)
    zone.close_round(1)  # site-c pushes other shards than a and b: not compared with them


def test_the_reference_can_be_turned_off() -> None:
    zone = ZoneAggregator(ZONE, "EU", bounds=AggregationConfig(max_norm_over_median=None))
    _push_round(zone, 1, {"site-a": 1.0, "site-b": 1.0, "site-c": 1000.0})
    zone.close_round(1)
    with pytest.raises(ValidationError):
        AggregationConfig(max_norm_over_median=1.0)  # must leave room above the median
