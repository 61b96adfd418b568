"""Residency configuration: shard classes and the policy that says where shards may go.

Every default lives here. A ``residency`` section of a federation file reads::

    residency:
      detectors: true              # automatic sensitivity detectors (embeddings, first layer, ...)
      classes:                     # tensor name globs → shard class; first match wins
        - pattern: "fc1.*"
          class: personal
          reason: sees lab values
      rules:                       # ordered; first match wins; no match → nothing allowed
        - name: eu-personal-data-stays-in-eu
          class: [personal, restricted]
          origin: [EU]
          allow_regions: [EU]
          preferred_zone: eu-central
          serve_to: [EU]
        - name: protected-us-personal-anywhere
          class: personal
          origin: [US]
          protection: {encrypted: true, update_dp_max_epsilon: 8.0}
          allow_regions: "*"
          serve_to: "*"
        - class: "*"
          allow_regions: "*"
          serve_to: "*"

A file's own ``rules`` **replace** the defaults (:func:`default_rules`) entirely; to
extend them, list the defaults again in the file, or in Python build
``ResidencyConfig(rules=[*my_rules, *default_rules()])``.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ANY",
    "ClassRule",
    "PolicyRule",
    "Protection",
    "ResidencyConfig",
    "ShardClass",
    "default_rules",
]

ANY: Final = "*"
"""Wildcard accepted by :class:`PolicyRule` selectors: any class, origin, region or recipient."""

_CLASS_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_JURISDICTION_RE = re.compile(r"^[A-Z]{2,8}$")
_ZONE_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"  # the same rule as zone names (config.models)


class ShardClass(StrEnum):
    """The built-in shard classes. Any other lowercase identifier is a user-defined class."""

    PUBLIC = "public"
    RESTRICTED = "restricted"
    PERSONAL = "personal"


class _Model(BaseModel):
    # ``class`` is a Python keyword: YAML uses the alias, Python code the field name.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)


# Error texts leave out scalar inputs: the config loader appends "(got ...)" itself.
_CLASS_HINT = "a shard class is a lowercase identifier such as 'personal' or 'genomic'"


def _check_class(value: object, *, in_list: bool = False) -> str:
    if not isinstance(value, str) or not _CLASS_RE.match(value):
        raise ValueError(f"{_CLASS_HINT} (got {value!r} in the list)" if in_list else _CLASS_HINT)
    return value


def _selector(value: object, what: str, pattern: re.Pattern[str], example: str) -> object:
    """Check a ``list[...] | "*"`` selector before pydantic sees it, so errors are one clear line."""
    if value == ANY:
        return value
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list such as [{example}], or '*' for any")
    for item in value:
        if not isinstance(item, str) or not pattern.match(item):
            raise ValueError(f"{what} entries are upper-case codes such as {example} (got {item!r})")
    return value


class ClassRule(_Model):
    """Give every tensor whose name matches ``pattern`` the shard class ``class``.

    Rules are tried in order; the first match wins and overrides the automatic detectors.
    """

    pattern: str = Field(min_length=1, description="fnmatch glob on tensor names, e.g. 'fc1.*' or '*.lora_*'")
    shard_class: str = Field(alias="class", description="public, restricted, personal or a user-defined class")
    reason: str | None = Field(None, description="why; shown in routing explanations")

    @field_validator("shard_class", mode="before")
    @classmethod
    def _class(cls, v: object) -> str:
        return _check_class(v)


class Protection(_Model):
    """Conditions on how a shard is protected; a rule applies only if all of them hold."""

    encrypted: bool | None = Field(None, description="true/false: only (un)encrypted shards; empty: either")
    update_dp_max_epsilon: float | None = Field(
        None, gt=0, description="only shards covered by update-level DP with ε at most this; empty: no condition"
    )

    @field_validator("update_dp_max_epsilon")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("update_dp_max_epsilon must be a finite number; leave it empty for no condition")
        return v

    @property
    def unconditional(self) -> bool:
        """True if every shard satisfies these conditions."""
        return self.encrypted is None and self.update_dp_max_epsilon is None


class PolicyRule(_Model):
    """One residency rule: (shard class, origin, protection) → where such shards may go.

    ``allow_regions: []`` is a deny rule: matching shards may not leave the site.
    """

    name: str | None = Field(None, max_length=80, description="label shown in explanations and audit logs")
    shard_class: str | list[str] = Field(alias="class", description="a class, a list of classes, or '*'")
    origin: list[str] | Literal["*"] = Field(ANY, description="jurisdictions of the sending site, or '*'")
    protection: Protection = Field(default_factory=Protection)
    allow_regions: list[str] | Literal["*"] = Field(description="regions that may receive, aggregate, store")
    preferred_zone: Annotated[str, Field(pattern=_ZONE_RE)] | None = None
    serve_to: list[str] | Literal["*"] = Field(description="jurisdictions that may receive the aggregate")

    @field_validator("shard_class", mode="before")
    @classmethod
    def _classes(cls, v: object) -> object:
        if v == ANY:
            return v
        if isinstance(v, list):
            if not v:
                raise ValueError("class must not be empty; use '*' for any class")
            for item in v:
                _check_class(item, in_list=True)
            return v
        return _check_class(v)

    @field_validator("origin", mode="before")
    @classmethod
    def _origin(cls, v: object) -> object:
        if v == []:
            raise ValueError("origin must not be empty (the rule would never match); use '*' for any")
        return _selector(v, "origin", _JURISDICTION_RE, "EU")

    @field_validator("allow_regions", mode="before")
    @classmethod
    def _regions(cls, v: object) -> object:
        return _selector(v, "allow_regions", _JURISDICTION_RE, "EU")

    @field_validator("serve_to", mode="before")
    @classmethod
    def _serve(cls, v: object) -> object:
        return _selector(v, "serve_to", _JURISDICTION_RE, "EU")

    @property
    def matches_everything(self) -> bool:
        """True if every shard matches this rule (so no later rule is ever reached)."""
        return self.shard_class == ANY and self.origin == ANY and self.protection.unconditional

    def canonical(self) -> dict[str, Any]:
        """Plain-data form with YAML key names (what the policy digest covers)."""
        return self.model_dump(mode="json", by_alias=True)


def default_rules() -> list[PolicyRule]:
    """The default residency rules (GDPR-like).

    1. ``personal`` and ``restricted`` shards of EU origin are received, aggregated and
       stored only in EU zones, and their aggregate is served only to EU sites.
    2. Everything else may go to any region and be served to anyone.
    """
    return [
        PolicyRule(
            name="eu-personal-data-stays-in-eu",
            shard_class=[ShardClass.PERSONAL.value, ShardClass.RESTRICTED.value],
            origin=["EU"],
            allow_regions=["EU"],
            serve_to=["EU"],
        ),
        PolicyRule(name="anything-else-anywhere", shard_class=ANY, origin=ANY, allow_regions=ANY, serve_to=ANY),
    ]


class ResidencyConfig(_Model):
    """Shard classes and residency policy of a federation.

    ``rules`` are ordered and the first match wins. Rules given here replace
    :func:`default_rules` entirely; a shard no rule matches may go nowhere.
    """

    classes: list[ClassRule] = Field(default_factory=list, description="tensor globs → shard class")
    detectors: bool = Field(True, description="classify leaky tensors (embeddings, first layer, ...) as personal")
    rules: list[PolicyRule] = Field(default_factory=default_rules, description="replaces the defaults entirely")
    encrypt: Literal["none", "all"] | list[str] = Field(
        "none", description="shard classes sent HE-encrypted: none, all, or a list such as [personal]"
    )

    def named_codes(self) -> set[str]:
        """Every jurisdiction or region code the rules name (origins, allowed regions, serve-to lists)."""
        return {
            code
            for rule in self.rules
            for codes in (rule.origin, rule.allow_regions, rule.serve_to)
            if codes != ANY
            for code in codes
        }

    @field_validator("encrypt", mode="before")
    @classmethod
    def _encrypt(cls, v: object) -> object:
        if isinstance(v, list):
            if not v:
                raise ValueError("encrypt: list at least one class, or write none")
            for item in v:
                _check_class(item, in_list=True)
        return v

    @property
    def encrypting(self) -> bool:
        """True if any shard class leaves sites HE-encrypted."""
        return self.encrypt != "none"

    def encrypts(self, shard_class: str) -> bool:
        """True if shards of ``shard_class`` leave sites HE-encrypted."""
        return self.encrypt == "all" or (isinstance(self.encrypt, list) and shard_class in self.encrypt)

    def undefined_classes(self) -> list[tuple[str, str]]:
        """``(where, class)`` for each class ``rules`` or ``encrypt`` name that no shard can be
        given: neither built in (:class:`ShardClass`) nor assigned by a ``classes`` entry.

        Such a name is a typo: a rule that names it never matches (its shards fall through to
        a later, perhaps laxer, rule), and ``encrypt`` would encrypt nothing of it.
        """
        known = {c.value for c in ShardClass} | {rule.shard_class for rule in self.classes}
        named: list[tuple[str, str]] = []
        for i, rule in enumerate(self.rules):
            names = [] if rule.shard_class == ANY else rule.shard_class
            named += [(f"residency.rules.{i}.class", n) for n in ([names] if isinstance(names, str) else names)]
        if isinstance(self.encrypt, list):
            named += [("residency.encrypt", n) for n in self.encrypt]
        return [(where, name) for where, name in named if name not in known]

    @field_validator("rules")
    @classmethod
    def _reachable(cls, rules: list[PolicyRule]) -> list[PolicyRule]:
        if not rules:
            raise ValueError("must not be empty: every shard would be refused; omit the key to use the defaults")
        for i, rule in enumerate(rules[:-1]):
            if rule.matches_everything:
                raise ValueError(
                    f"rule {i + 1} can never match: rule {i} matches every shard; move the catch-all rule last"
                )
        return rules
