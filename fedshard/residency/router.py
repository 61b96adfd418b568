"""Routing: which zone a site sends each gradient shard to.

The router is deterministic and explains itself. Among the zones whose region the
policy allows for a shard it picks, in order:

1. the rule's preferred zone;
2. a zone in the site's own region (lowest name first);
3. the reducing zone (where cross-region partial sums meet);
4. the zone with the lowest name.

When no zone may hold a shard it raises :class:`~fedshard.errors.ResidencyViolationError`
rather than pick one: nothing leaves the site.

Every shard also gets a **scope**. A shard is ``global`` when there is a reducing zone,
the policy lets the shard be held in the reducing zone's region and lets its
aggregate be served to anyone: the zone that receives it forwards its partial sum
to the reducing zone, and every site applies the same global mean. Otherwise it is
``regional``: it is aggregated where it was received, together with the shards whose
aggregate may be served to the same jurisdictions, and only those sites share that
mean (global layers + regional/personal layers). :attr:`RouteDecision.group` names
the aggregate a shard ends up in: ``global``, ``regional/any`` or ``regional/EU``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from fedshard.errors import ConfigError, IntegrityError, ResidencyViolationError
from fedshard.residency._classifier import Classification
from fedshard.residency._policy import ANY_REGION, Policy, PolicyDecision, Selection, ShardProtection

__all__ = [
    "DEFAULT_GROUP",
    "GLOBAL_GROUP",
    "AggregateKey",
    "RouteDecision",
    "Router",
    "Scope",
    "ZoneInfo",
    "group_name",
]


class Scope(StrEnum):
    """Where a shard's aggregate is completed."""

    REGIONAL = "regional"
    """In the zone that received it; served to the sites whose shards met there."""
    GLOBAL = "global"
    """In the reducing zone, from the partial sums every zone forwards; served to all."""


def group_name(scope: Scope, serve_to: Selection) -> str:
    """Name of the aggregate a shard joins: ``global``, or ``regional/`` + who may receive it
    (``any``, or jurisdictions joined by ``+``)."""
    if scope is Scope.GLOBAL:
        return Scope.GLOBAL.value
    who = "any" if serve_to == ANY_REGION else "+".join(sorted(serve_to)) or "none"
    return f"{Scope.REGIONAL.value}/{who}"


GLOBAL_GROUP = group_name(Scope.GLOBAL, ANY_REGION)
"""The one aggregate of ``global`` shards, completed in the reducing zone (``"global"``)."""
DEFAULT_GROUP = group_name(Scope.REGIONAL, ANY_REGION)
"""The aggregate every shard joins when residency puts no constraint on it (``"regional/any"``)."""


class AggregateKey(NamedTuple):
    """Names one published aggregate: the zone that publishes it and its group.

    ``str(key)`` is ``zone|group``, the form the coordinator's round root is computed
    over (so it is part of every model version: it never changes); zone names never
    hold ``|`` (config rule), so :meth:`parse` is exact.
    """

    zone: str
    group: str

    def __str__(self) -> str:
        return f"{self.zone}|{self.group}"

    @classmethod
    def parse(cls, text: str) -> AggregateKey:
        """The key written as ``zone|group``; :class:`IntegrityError` if it is not one."""
        zone, sep, group = text.partition("|")
        if not (sep and zone and group):
            raise IntegrityError(f"malformed aggregate key {text!r}: expected zone|group, e.g. eu-central|global")
        return cls(zone, group)


@dataclass(frozen=True, slots=True)
class ZoneInfo:
    """A zone as the router sees it: its name and the region it runs in."""

    name: str
    region: str


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where one shard goes, and why.

    Attributes
    ----------
    shard_id:
        The shard.
    shard_class:
        Its class.
    reason:
        Why it has that class (the classifier's reason).
    rule:
        The policy rule that decided (its reason line).
    allowed_regions:
        Regions the rule allows, sorted, or ``["*"]`` for any.
    zone:
        The chosen zone's name: where the site pushes the shard.
    scope:
        :class:`Scope`: aggregated in ``zone`` (regional) or in the reducing zone (global).
    final_zone:
        The zone that publishes the shard's aggregate (``zone``, or the reducing zone).
    """

    shard_id: str
    shard_class: str
    reason: str
    rule: str
    allowed_regions: list[str]
    zone: str
    scope: Scope = Scope.REGIONAL
    final_zone: str = ""

    group: str = ""

    @property
    def aggregate(self) -> AggregateKey:
        """``(final zone, group)``: the aggregate a site applies for this shard."""
        return AggregateKey(self.final_zone or self.zone, self.group or group_name(self.scope, ANY_REGION))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for ``fedshard route`` and audit logs)."""
        return {
            "shard_id": self.shard_id,
            "shard_class": self.shard_class,
            "reason": self.reason,
            "rule": self.rule,
            "allowed_regions": list(self.allowed_regions),
            "zone": self.zone,
            "scope": self.scope.value,
            "final_zone": self.final_zone or self.zone,
            "group": self.aggregate[1],
        }


class Router:
    """Pick a zone for every shard, as the residency policy allows.

    Parameters
    ----------
    policy:
        The federation's residency policy.
    zones:
        The zones of the federation (unique names).
    reducing_zone:
        The zone partial sums are reduced in, if any; it must be one of ``zones``.
    """

    def __init__(self, policy: Policy, zones: Sequence[ZoneInfo], reducing_zone: str | None = None) -> None:
        names = [z.name for z in zones]
        if len(set(names)) != len(names):
            raise ConfigError(f"zone names must be unique, got {', '.join(names)}")
        if reducing_zone is not None and reducing_zone not in names:
            raise ConfigError(f"reducing zone {reducing_zone!r} is not one of the zones ({', '.join(names) or 'none'})")
        self.policy = policy
        self.zones: tuple[ZoneInfo, ...] = tuple(sorted(zones, key=lambda z: z.name))
        self.reducing_zone = reducing_zone
        self._routes: dict[tuple[str, str, ShardProtection | None], tuple[str, list[str], str, Scope, str, str]] = {}

    def route(
        self,
        shard_id: str,
        classification: Classification,
        origin: str,
        protection: ShardProtection | None = None,
    ) -> RouteDecision:
        """Choose the zone for one shard.

        Parameters
        ----------
        shard_id:
            The shard (``fc1.weight#r0c0``).
        classification:
            Its class and the reason for it.
        origin:
            The sending site's jurisdiction.
        protection:
            How the shard is protected when it leaves the site.

        Raises
        ------
        ResidencyViolationError
            If the policy allows none of the zones.
        """
        # Everything but the shard id and the reason depends only on (class, origin,
        # protection): decide once per combination (a model has millions of shards, a
        # policy a handful of combinations).
        key = (classification.shard_class, origin, protection)
        route = self._routes.get(key)
        if route is None:
            decision = self.policy.decide(classification.shard_class, origin, protection)
            zone = self._choose(decision, origin)
            if zone is None:
                raise ResidencyViolationError(self._no_zone(shard_id, classification.shard_class, origin, decision))
            allowed = ["*"] if decision.allowed_regions == ANY_REGION else sorted(decision.allowed_regions)
            scope = self.scope_of(decision)
            final = self.reducing_zone if scope is Scope.GLOBAL and self.reducing_zone is not None else zone
            route = self._routes[key] = (
                decision.reason,
                allowed,
                zone,
                scope,
                final,
                group_name(scope, decision.serve_to),
            )
        rule, allowed, zone, scope, final, group = route
        return RouteDecision(
            shard_id, classification.shard_class, classification.reason, rule, list(allowed), zone, scope, final, group
        )

    def zone_for(self, decision: PolicyDecision, origin: str) -> str | None:
        """The zone a site in ``origin`` pushes a shard under ``decision`` to (its first
        hop: a global shard goes on from there to the reducing zone); None: no zone may hold it."""
        return self._choose(decision, origin)

    def route_group(self, decision: PolicyDecision) -> str:
        """The aggregate a shard under ``decision`` joins (see :func:`group_name`)."""
        return group_name(self.scope_of(decision), decision.serve_to)

    def scope_of(self, decision: PolicyDecision) -> Scope:
        """Global when a reducing zone exists, the decision allows its region and serves anyone."""
        reducer = self._reducer_region
        if reducer is not None and decision.permits(reducer) and decision.serve_to == ANY_REGION:
            return Scope.GLOBAL
        return Scope.REGIONAL

    @property
    def _reducer_region(self) -> str | None:
        for z in self.zones:
            if z.name == self.reducing_zone:
                return z.region
        return None

    def route_plan(
        self,
        classifications: Mapping[str, Classification],
        origin: str,
        protection: ShardProtection | None = None,
    ) -> list[RouteDecision]:
        """Route every classified shard, in the mapping's (plan) order.

        Raises
        ------
        ResidencyViolationError
            For the first shard that no zone may hold; then no shard should be sent.
        """
        return [self.route(shard_id, c, origin, protection) for shard_id, c in classifications.items()]

    # internals ------------------------------------------------------------------------
    def _choose(self, decision: PolicyDecision, origin: str) -> str | None:
        allowed = [z for z in self.zones if decision.permits(z.region)]  # sorted by name
        if not allowed:
            return None
        names = {z.name for z in allowed}
        if decision.preferred_zone in names:
            return decision.preferred_zone
        local = [z.name for z in allowed if z.region == origin]
        if local:
            return local[0]
        if self.reducing_zone in names:
            return self.reducing_zone
        return allowed[0].name

    def _no_zone(self, shard_id: str, shard_class: str, origin: str, decision: PolicyDecision) -> str:
        if decision.rule_index is None:
            regions = "none (no residency rule matches)"
        elif decision.allowed_regions == ANY_REGION:
            regions = "any"
        else:
            regions = ", ".join(sorted(decision.allowed_regions)) or f"none (rule {decision.rule_index} denies)"
        zones = ", ".join(f"{z.name} ({z.region})" for z in self.zones) or "none"
        return (
            f"residency: no zone may hold shard {shard_id} ({shard_class}, origin {origin}): "
            f"allowed regions {regions}, zones: {zones}"
        )
