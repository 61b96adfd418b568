"""Router: deterministic, explainable zone choice; refuses rather than send a shard where it may not go."""

from __future__ import annotations

import pytest
from torch import nn

from fedshard.config import PolicyRule, ResidencyConfig
from fedshard.errors import ConfigError, IntegrityError, ResidencyViolationError
from fedshard.residency import (
    DEFAULT_GROUP,
    GLOBAL_GROUP,
    AggregateKey,
    Classification,
    Policy,
    RouteDecision,
    Router,
    Scope,
    SensitivityClassifier,
    ShardProtection,
    ZoneInfo,
)
from fedshard.sharding import ShardPlan

PERSONAL = Classification("personal", "first layer: sees raw input features")
PUBLIC = Classification("public", "no detector matched")
ZONES = [ZoneInfo("us-east", "US"), ZoneInfo("eu-west", "EU"), ZoneInfo("eu-central", "EU"), ZoneInfo("ap-sg", "SG")]


def _rule(**kwargs: object) -> PolicyRule:
    data: dict[str, object] = {"class": "*", "allow_regions": "*", "serve_to": "*"}
    data.update(kwargs)
    return PolicyRule.model_validate(data)


@pytest.fixture
def router() -> Router:
    return Router(Policy.from_config(ResidencyConfig()), ZONES, reducing_zone="us-east")


def test_eu_personal_shard_goes_to_an_eu_zone(router: Router) -> None:
    decision = router.route("fc1.weight#r0c0", PERSONAL, "EU")
    assert decision == RouteDecision(
        shard_id="fc1.weight#r0c0",
        shard_class="personal",
        reason="first layer: sees raw input features",
        rule=router.policy.decide("personal", "EU").reason,
        allowed_regions=["EU"],
        zone="eu-central",  # the origin's region, lowest name
        scope=Scope.REGIONAL,  # may not reach the reducing zone's region (US)
        final_zone="eu-central",
        group="regional/EU",
    )
    assert "rule 0 (eu-personal-data-stays-in-eu)" in decision.rule
    assert decision.to_dict()["zone"] == "eu-central"


def test_public_shard_stays_in_the_origin_region(router: Router) -> None:
    assert router.route("fc2.weight#r0c0", PUBLIC, "EU").zone == "eu-central"
    assert router.route("fc2.weight#r0c0", PUBLIC, "SG").zone == "ap-sg"
    assert router.route("fc2.weight#r0c0", PUBLIC, "SG").allowed_regions == ["*"]


def test_shards_allowed_anywhere_are_reduced_globally(router: Router) -> None:
    decision = router.route("fc2.weight#r0c0", PUBLIC, "SG")
    assert (decision.zone, decision.scope, decision.final_zone, decision.group) == (
        "ap-sg",
        Scope.GLOBAL,
        "us-east",
        "global",
    )
    assert decision.aggregate == AggregateKey("us-east", GLOBAL_GROUP)
    assert GLOBAL_GROUP == Scope.GLOBAL == "global"


def test_without_a_reducing_zone_everything_is_regional() -> None:
    router = Router(Policy.from_config(ResidencyConfig()), ZONES)
    assert router.route("fc2.weight#r0c0", PUBLIC, "SG").aggregate == AggregateKey("ap-sg", DEFAULT_GROUP)
    assert router.route("fc1.weight#r0c0", PERSONAL, "EU").aggregate == AggregateKey("eu-central", "regional/EU")
    assert DEFAULT_GROUP == "regional/any"


def test_aggregate_key_is_written_zone_bar_group_and_parsed_back() -> None:
    key = AggregateKey("eu-central", "regional/EU+US")

    assert str(key) == "eu-central|regional/EU+US"  # part of every model version: never changes
    assert AggregateKey.parse(str(key)) == key
    assert AggregateKey.parse("z|global") == ("z", "global")


@pytest.mark.parametrize("text", ["", "eu-central", "|global", "eu-central|", "eu-central,global"])
def test_a_malformed_aggregate_key_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(IntegrityError, match="expected zone\\|group") as info:
        AggregateKey.parse(text)

    assert "\n" not in str(info.value)


def test_a_rule_that_serves_only_some_jurisdictions_is_regional() -> None:
    rules = [_rule(allow_regions="*", serve_to=["US", "EU"])]
    router = Router(Policy(rules), ZONES, reducing_zone="us-east")
    decision = router.route("fc2.weight#r0c0", PUBLIC, "US")
    assert (decision.scope, decision.group) == (Scope.REGIONAL, "regional/EU+US")


def test_reducing_zone_when_origin_region_has_no_zone(router: Router) -> None:
    assert router.route("fc2.weight#r0c0", PUBLIC, "UK").zone == "us-east"


def test_lowest_name_when_nothing_else_applies() -> None:
    router = Router(Policy([_rule()]), ZONES)
    assert router.route("x#r0c0", PUBLIC, "UK").zone == "ap-sg"
    router = Router(Policy([_rule(allow_regions=["EU", "US"])]), ZONES, reducing_zone="ap-sg")
    assert router.route("x#r0c0", PUBLIC, "UK").zone == "eu-central"  # reducing zone not allowed


def test_preferred_zone_first_when_allowed() -> None:
    rules = [_rule(**{"class": "personal", "allow_regions": ["EU"], "preferred_zone": "eu-west"})]
    router = Router(Policy(rules), ZONES, reducing_zone="eu-central")
    assert router.route("x#r0c0", PERSONAL, "EU").zone == "eu-west"
    # a preferred zone in a forbidden region is ignored
    rules = [_rule(**{"class": "personal", "allow_regions": ["EU"], "preferred_zone": "us-east"})]
    assert Router(Policy(rules), ZONES).route("x#r0c0", PERSONAL, "US").zone == "eu-central"
    # so is one that does not exist
    rules = [_rule(**{"class": "personal", "preferred_zone": "nowhere"})]
    assert Router(Policy(rules), ZONES).route("x#r0c0", PERSONAL, "US").zone == "us-east"


def test_no_allowed_zone_raises_one_line(router: Router) -> None:
    us_only = Router(router.policy, [ZoneInfo("us-east", "US"), ZoneInfo("ap-sg", "SG")])
    with pytest.raises(ResidencyViolationError) as info:
        us_only.route("fc1.weight#r0c0", PERSONAL, "EU")
    assert str(info.value) == (
        "residency: no zone may hold shard fc1.weight#r0c0 (personal, origin EU): "
        "allowed regions EU, zones: ap-sg (SG), us-east (US)"
    )
    assert isinstance(info.value, PermissionError)


def test_fail_closed_and_deny_rules_raise() -> None:
    router = Router(Policy([_rule(**{"class": "public"})]), ZONES)
    with pytest.raises(ResidencyViolationError, match=r"allowed regions none \(no residency rule matches\)"):
        router.route("x#r0c0", PERSONAL, "EU")
    router = Router(Policy([_rule(**{"class": "personal", "allow_regions": []})]), ZONES)
    with pytest.raises(ResidencyViolationError, match=r"allowed regions none \(rule 0 denies\)"):
        router.route("x#r0c0", PERSONAL, "EU")
    with pytest.raises(ResidencyViolationError, match="zones: none"):
        Router(Policy([_rule()]), []).route("x#r0c0", PUBLIC, "EU")


def test_protection_changes_the_route() -> None:
    rules = [
        _rule(**{"class": "personal", "protection": {"encrypted": True}}),
        _rule(**{"class": "personal", "allow_regions": ["EU"]}),
    ]
    router = Router(Policy(rules), ZONES, reducing_zone="us-east")
    assert router.route("x#r0c0", PERSONAL, "UK", ShardProtection(encrypted=True)).zone == "us-east"
    assert router.route("x#r0c0", PERSONAL, "UK").zone == "eu-central"


def test_route_plan_in_plan_order(router: Router) -> None:
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    plan = ShardPlan.from_state_dict(model.state_dict(), tile=(4, 4))
    classes = SensitivityClassifier().classify(plan, model)
    routes = router.route_plan(classes, "US")
    assert [r.shard_id for r in routes] == plan.shard_ids
    assert {r.zone for r in routes} == {"us-east"}  # defaults: US data may go anywhere; stays local
    routes = router.route_plan(classes, "EU")
    personal = {r.shard_id for r in routes if r.shard_class == "personal"}
    assert personal == {sid for sid in plan.shard_ids if sid.startswith(("0.", "4.bias"))}
    assert all(r.zone == "eu-central" for r in routes)
    uk = router.route_plan(classes, "UK")
    assert {r.zone for r in uk} == {"us-east"}


def test_routing_is_independent_of_zone_order(router: Router) -> None:
    shuffled = Router(router.policy, list(reversed(ZONES)), reducing_zone="us-east")
    for origin in ("EU", "US", "UK", "SG"):
        for c in (PERSONAL, PUBLIC):
            assert shuffled.route("x#r0c0", c, origin) == router.route("x#r0c0", c, origin)


def test_bad_router_config() -> None:
    policy = Policy([_rule()])
    with pytest.raises(ConfigError, match="zone names must be unique"):
        Router(policy, [ZoneInfo("a", "EU"), ZoneInfo("a", "US")])
    with pytest.raises(ConfigError, match="reducing zone 'b' is not one of the zones"):
        Router(policy, [ZoneInfo("a", "EU")], reducing_zone="b")
