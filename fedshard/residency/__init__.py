"""Data residency: shard classification, residency policy and policy-driven routing.

Sites classify every gradient shard (:class:`SensitivityClassifier`), look up where the
policy lets it go (:class:`Policy`) and send it to the zone the :class:`Router` picks;
zones re-check each shard against the same policy (:meth:`Policy.permits_region`) and
refuse it when the policy forbids their region.
"""

from fedshard.residency._classifier import Classification, SensitivityClassifier
from fedshard.residency._policy import ANY_REGION, Policy, PolicyDecision, Selection, ShardProtection, refusal
from fedshard.residency.router import (
    DEFAULT_GROUP,
    GLOBAL_GROUP,
    AggregateKey,
    RouteDecision,
    Router,
    Scope,
    ZoneInfo,
    group_name,
)

__all__ = [
    "ANY_REGION",
    "DEFAULT_GROUP",
    "GLOBAL_GROUP",
    "AggregateKey",
    "Classification",
    "Policy",
    "PolicyDecision",
    "RouteDecision",
    "Router",
    "Scope",
    "Selection",
    "SensitivityClassifier",
    "ShardProtection",
    "ZoneInfo",
    "group_name",
    "refusal",
]
