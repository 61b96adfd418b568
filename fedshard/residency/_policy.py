"""Residency policy: where a shard of a given class, origin and protection may go.

A :class:`Policy` is an ordered list of :class:`~fedshard.config.residency.PolicyRule`;
the first rule that matches a shard decides. Sites use it to route shards and zones use
the very same policy (checked by its :attr:`Policy.digest`) to re-check every shard they
receive. The policy **fails closed**: a shard that no rule matches may go nowhere and
its aggregate may be served to no one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from fedshard.config.residency import ANY, PolicyRule, ResidencyConfig
from fedshard.integrity.canonical import canonical_text

__all__ = ["ANY_REGION", "Policy", "PolicyDecision", "Selection", "ShardProtection", "refusal"]

ANY_REGION: Final = "any"
""":attr:`PolicyDecision.allowed_regions` / ``serve_to`` when every region (jurisdiction) is allowed."""

_POLICY_FORMAT = 1

Selection = frozenset[str] | Literal["any"]
"""A set of names, or ``"any"``."""


@dataclass(frozen=True, slots=True)
class ShardProtection:
    """How a gradient shard is protected when it leaves the site.

    Parameters
    ----------
    encrypted:
        True if the shard is HE-encrypted.
    update_dp_epsilon:
        ε of the update-level DP that covers the shard, or None if there is none.
    """

    encrypted: bool = False
    update_dp_epsilon: float | None = None

    def __post_init__(self) -> None:
        eps = self.update_dp_epsilon
        if eps is not None and not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"update_dp_epsilon must be a positive finite number or None, got {eps!r}")

    def describe(self) -> str:
        """Short text such as ``"encrypted, update DP ε=2"`` or ``"none"``."""
        parts = ["encrypted"] if self.encrypted else []
        if self.update_dp_epsilon is not None:
            parts.append(f"update DP ε={self.update_dp_epsilon:g}")
        return ", ".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """What the policy says about one (shard class, origin, protection).

    Attributes
    ----------
    rule_index:
        Index of the matching rule, or None when no rule matches (nothing is allowed).
    allowed_regions:
        Regions whose zones may receive, aggregate and store the shard, or ``"any"``.
    preferred_zone:
        The rule's preferred zone, if any.
    serve_to:
        Jurisdictions that may receive the aggregate of such shards, or ``"any"``.
    reason:
        One line naming the rule (or saying that none matched).
    """

    rule_index: int | None
    allowed_regions: Selection
    preferred_zone: str | None
    serve_to: Selection
    reason: str

    def permits(self, region: str) -> bool:
        """True if a zone in ``region`` may hold the shard."""
        return self.allowed_regions == ANY_REGION or region in self.allowed_regions

    def serves(self, jurisdiction: str) -> bool:
        """True if a site in ``jurisdiction`` may receive the aggregate."""
        return self.serve_to == ANY_REGION or jurisdiction in self.serve_to


def refusal(shard_id: str, shard_class: str, origin: str, region: str) -> str:
    """The one-line message a zone gives when it refuses a shard.

    ``residency: shard fc1.weight#r0c0 (personal, origin EU) may not be received in region US``
    """
    return f"residency: shard {shard_id} ({shard_class}, origin {origin}) may not be received in region {region}"


def _as_set(selector: list[str] | str) -> Selection:
    return ANY_REGION if selector == ANY else frozenset(selector)


def _show(values: Selection) -> str:
    if values == ANY_REGION:
        return "any"
    return ", ".join(sorted(values)) or "none"


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A rule with its selectors turned into sets, so matching is a few lookups."""

    classes: Selection
    origins: Selection
    encrypted: bool | None
    max_epsilon: float | None
    decision: PolicyDecision

    def matches(self, shard_class: str, origin: str, protection: ShardProtection) -> bool:
        if self.classes != ANY_REGION and shard_class not in self.classes:
            return False
        if self.origins != ANY_REGION and origin not in self.origins:
            return False
        if self.encrypted is not None and protection.encrypted != self.encrypted:
            return False
        if self.max_epsilon is not None:
            eps = protection.update_dp_epsilon
            if eps is None or eps > self.max_epsilon:
                return False
        return True


def _compile(index: int, rule: PolicyRule) -> _Compiled:
    selector = rule.shard_class
    classes = _as_set([selector] if isinstance(selector, str) and selector != ANY else selector)
    label = f"rule {index}" + (f" ({rule.name})" if rule.name else "")
    conditions = [f"class {_show(classes)}", f"origin {_show(_as_set(rule.origin))}"]
    if rule.protection.encrypted is not None:
        conditions.append("encrypted" if rule.protection.encrypted else "not encrypted")
    if rule.protection.update_dp_max_epsilon is not None:
        conditions.append(f"update DP ε ≤ {rule.protection.update_dp_max_epsilon:g}")
    allowed, serve = _as_set(rule.allow_regions), _as_set(rule.serve_to)
    reason = f"{label}: {'; '.join(conditions)} → regions {_show(allowed)}, served to {_show(serve)}"
    decision = PolicyDecision(index, allowed, rule.preferred_zone, serve, reason)
    return _Compiled(
        classes, _as_set(rule.origin), rule.protection.encrypted, rule.protection.update_dp_max_epsilon, decision
    )


class Policy:
    """An ordered list of residency rules; the first match wins, no match allows nothing.

    Parameters
    ----------
    rules:
        The rules, in order (for instance ``ResidencyConfig().rules``).
    """

    def __init__(self, rules: Sequence[PolicyRule], encrypt: str | Sequence[str] = "none") -> None:
        self.rules: tuple[PolicyRule, ...] = tuple(rules)
        self.encrypt: str | tuple[str, ...] = encrypt if isinstance(encrypt, str) else tuple(sorted(encrypt))
        self._compiled = tuple(_compile(i, rule) for i, rule in enumerate(self.rules))
        self._digest: str | None = None

    @classmethod
    def from_config(cls, config: ResidencyConfig) -> Policy:
        """The policy of a federation's residency config."""
        return cls(config.rules, config.encrypt)

    def encrypts(self, shard_class: str) -> bool:
        """True if shards of ``shard_class`` leave sites HE-encrypted."""
        return self.encrypt == "all" or (isinstance(self.encrypt, tuple) and shard_class in self.encrypt)

    # identity -------------------------------------------------------------------------
    def to_json(self) -> str:
        """Canonical JSON of the rules as written and of the encrypted classes: the same policy
        always gives the same bytes."""
        encrypt = self.encrypt if isinstance(self.encrypt, str) else list(self.encrypt)
        data = {"format": _POLICY_FORMAT, "rules": [rule.canonical() for rule in self.rules], "encrypt": encrypt}
        return canonical_text(data)

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of :meth:`to_json`; sites and zones compare it to know they share a policy."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.to_json().encode()).hexdigest()
        return self._digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"Policy({len(self.rules)} rules, digest={self.digest[:12]})"

    # decisions ------------------------------------------------------------------------
    def decide(self, shard_class: str, origin: str, protection: ShardProtection | None = None) -> PolicyDecision:
        """What the first matching rule says about such a shard.

        Parameters
        ----------
        shard_class:
            The shard's class (``personal``).
        origin:
            Jurisdiction of the site that sends it (``EU``).
        protection:
            How the shard is protected; default: not encrypted, no update-level DP.

        Returns
        -------
        PolicyDecision
            When no rule matches, a decision that allows no region and serves no one.
        """
        protection = protection or ShardProtection()
        for rule in self._compiled:
            if rule.matches(shard_class, origin, protection):
                return rule.decision
        reason = (
            f"no residency rule matches class {shard_class}, origin {origin}, protection {protection.describe()}: "
            "nothing is allowed (add a rule for it)"
        )
        return PolicyDecision(None, frozenset(), None, frozenset(), reason)

    def permits_region(
        self,
        shard_class: str,
        origin: str,
        protection: ShardProtection | None,
        region: str,
        *,
        shard_id: str | None = None,
    ) -> tuple[bool, str]:
        """Whether a zone in ``region`` may receive, aggregate and store such a shard.

        Returns
        -------
        tuple
            ``(True, rule reason)``, or ``(False, refusal)`` where the refusal is
            :func:`refusal`'s line when ``shard_id`` is given.
        """
        decision = self.decide(shard_class, origin, protection)
        if decision.permits(region):
            return True, decision.reason
        if shard_id is not None:
            return False, refusal(shard_id, shard_class, origin, region)
        return False, f"residency: a {shard_class} shard of origin {origin} may not be received in region {region}"

    def may_serve(self, shard_class: str, origin: str, protection: ShardProtection | None, jurisdiction: str) -> bool:
        """Whether a site in ``jurisdiction`` may receive the aggregate of such shards."""
        return self.decide(shard_class, origin, protection).serves(jurisdiction)
