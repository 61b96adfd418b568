"""Property test of residency routing: a shard never goes where the policy forbids.

Hypothesis draws 1,000 random federations: a policy of up to five rules (class, origin
and region selectors, protection conditions, preferred zones, deny rules, or no rule
at all), a set of up to five zones in random regions and a random reducing zone. Each
is checked for every site jurisdiction (4) × shard class (5: the three built-ins and two
user-defined) × protection (4: none, encrypted, update-level DP, both, random ε), so
1,000 × 80 = **80,000 cases** are checked (the test counts them and asserts ≥ 10,000).

For every case, against an independent first-match oracle written from the rules:

* ``decide`` picks the oracle's rule (none when no rule matches: fail closed);
* ``permits_region`` agrees with ``decide`` and the oracle for every region, so a
  zone never accepts a shard the policy forbids, and ``may_serve`` agrees likewise;
* the router picks a zone whose region the policy allows, chosen by the documented
  order (preferred, origin region, reducing zone, lowest name), and the receiving
  zone's re-check accepts it; it raises ``ResidencyViolationError`` exactly when no
  zone is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from fedshard.config import PolicyRule, Protection
from fedshard.errors import ResidencyViolationError
from fedshard.residency import Classification, Policy, Router, ShardProtection, ZoneInfo

CLASSES = ["public", "restricted", "personal", "genomic", "finance"]
JURISDICTIONS = ["EU", "US", "UK", "SG"]
ZONE_NAMES = ["ap-1", "eu-1", "eu-2", "uk-1", "us-1"]
EXAMPLES = 1_000
CASES_PER_EXAMPLE = len(JURISDICTIONS) * len(CLASSES) * 4


@dataclass
class _Counter:
    cases: int = 0


COUNTER = _Counter()


def _selector(pool: list[str], min_size: int) -> st.SearchStrategy[list[str] | str]:
    return st.one_of(st.just("*"), st.lists(st.sampled_from(pool), min_size=min_size, max_size=3, unique=True))


rules = st.builds(
    PolicyRule,
    name=st.none(),
    shard_class=st.one_of(st.sampled_from(["*", *CLASSES]), st.lists(st.sampled_from(CLASSES), min_size=1, max_size=3)),
    origin=_selector(JURISDICTIONS, 1),
    protection=st.builds(
        Protection,
        encrypted=st.none() | st.booleans(),
        update_dp_max_epsilon=st.none() | st.sampled_from([0.5, 1.0, 4.0]),
    ),
    allow_regions=_selector(JURISDICTIONS, 0),
    preferred_zone=st.none() | st.sampled_from([*ZONE_NAMES, "nowhere"]),
    serve_to=_selector(JURISDICTIONS, 0),
)
zone_sets = st.lists(
    st.builds(ZoneInfo, st.sampled_from(ZONE_NAMES), st.sampled_from(JURISDICTIONS)),
    max_size=5,
    unique_by=lambda z: z.name,
)


def _oracle(policy_rules: list[PolicyRule], shard_class: str, origin: str, p: ShardProtection) -> PolicyRule | None:
    """First matching rule, written straight from the rule fields."""
    for rule in policy_rules:
        classes = [rule.shard_class] if isinstance(rule.shard_class, str) else rule.shard_class
        if "*" not in classes and shard_class not in classes:
            continue
        if rule.origin != "*" and origin not in rule.origin:
            continue
        if rule.protection.encrypted is not None and rule.protection.encrypted != p.encrypted:
            continue
        bound = rule.protection.update_dp_max_epsilon
        if bound is not None and (p.update_dp_epsilon is None or p.update_dp_epsilon > bound):
            continue
        return rule
    return None


def _allows(selector: list[str] | str, value: str) -> bool:
    return selector == "*" or value in selector


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    policy_rules=st.lists(rules, max_size=5),
    zones=zone_sets,
    reducing=st.none() | st.sampled_from(ZONE_NAMES),
    epsilon=st.sampled_from([0.25, 1.0, 2.0, 8.0]),
)
def _check_routing(policy_rules: list[PolicyRule], zones: list[ZoneInfo], reducing: str | None, epsilon: float) -> None:
    policy = Policy(policy_rules)
    reducing = reducing if reducing in {z.name for z in zones} else None
    router = Router(policy, zones, reducing_zone=reducing)
    protections = [
        ShardProtection(),
        ShardProtection(encrypted=True),
        ShardProtection(update_dp_epsilon=epsilon),
        ShardProtection(encrypted=True, update_dp_epsilon=epsilon),
    ]
    for origin in JURISDICTIONS:
        for shard_class in CLASSES:
            for protection in protections:
                COUNTER.cases += 1
                rule = _oracle(policy_rules, shard_class, origin, protection)
                decision = policy.decide(shard_class, origin, protection)
                assert decision.rule_index == (None if rule is None else policy_rules.index(rule))

                for region in JURISDICTIONS:
                    allowed = rule is not None and _allows(rule.allow_regions, region)
                    assert policy.permits_region(shard_class, origin, protection, region)[0] is allowed
                    assert decision.permits(region) is allowed
                    served = rule is not None and _allows(rule.serve_to, region)
                    assert policy.may_serve(shard_class, origin, protection, region) is served

                ok_zones = sorted(z.name for z in zones if rule is not None and _allows(rule.allow_regions, z.region))
                shard_id = f"t{len(policy_rules)}.weight#r0c0"
                try:
                    route = router.route(shard_id, Classification(shard_class, "test"), origin, protection)
                except ResidencyViolationError as exc:
                    assert not ok_zones, f"refused although {ok_zones} are allowed: {exc}"
                    continue
                assert ok_zones, f"routed to {route.zone} although the policy allows no zone"
                region = next(z.region for z in zones if z.name == route.zone)
                assert policy.permits_region(shard_class, origin, protection, region, shard_id=shard_id)[0]
                assert rule is not None
                local = [n for n in ok_zones if next(z.region for z in zones if z.name == n) == origin]
                expected = (
                    rule.preferred_zone
                    if rule.preferred_zone in ok_zones
                    else local[0]
                    if local
                    else reducing
                    if reducing in ok_zones
                    else ok_zones[0]
                )
                assert route.zone == expected


def test_router_never_sends_a_shard_where_the_policy_forbids() -> None:
    COUNTER.cases = 0
    _check_routing()
    assert COUNTER.cases >= 10_000, f"only {COUNTER.cases} cases were checked"
