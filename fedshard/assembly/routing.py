"""Routing a federation's shards: classify every shard, then let the policy pick its zone.

Everything here is derived from the federation config alone, deterministically, so a
site, a zone and ``fedshard route explain`` reach the same decisions independently:
sites push by them, zones re-check them (:func:`zone_policy_for`), so a shard never
goes where the policy forbids.

Classifying shards needs the model (its module types). A process classifies a
federation's model once (:func:`model_classes`), and a site classifies with the model
it already holds (:func:`classify`), keeping the result in its state folder under
:func:`classification_key`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fedshard.config import FederationConfig
from fedshard.errors import ConfigError, ResidencyViolationError
from fedshard.residency import (
    Classification,
    Policy,
    RouteDecision,
    Router,
    SensitivityClassifier,
    ShardProtection,
    ZoneInfo,
)
from fedshard.sharding import ShardPlan
from fedshard.site.routes import SiteRouting
from fedshard.task import build_initial_model, load_task, trained_state
from fedshard.zone.policy import ZonePolicy

if TYPE_CHECKING:
    import torch

__all__ = [
    "check_regrouping",
    "FederationRouting",
    "classification_key",
    "classify",
    "explain_routes",
    "model_classes",
    "router_for",
    "shard_protection",
    "site_zones",
]

_CLASSIFIED: dict[str, tuple[ShardPlan, dict[str, Classification]]] = {}
_CLASSIFIED_LOCK = threading.Lock()


def router_for(config: FederationConfig) -> Router:
    """The federation's router: its policy over its zones (a drained zone is routed nothing)."""
    zones = [ZoneInfo(z.name, z.region) for z in config.zones if not z.drain]
    return Router(Policy.from_config(config.residency), zones, config.reducing_zone)


def site_zones(config: FederationConfig, site_id: str) -> dict[str, list[str]]:
    """The zones site ``site_id`` may push to (its first hop), each with the shard classes it
    would send there: every built-in class and every class the config assigns, whether or not
    the model has shards of it (no model is built: what a site checks before it starts)."""
    from fedshard.config.residency import ShardClass

    jurisdiction = config.site(site_id).jurisdiction
    router = router_for(config)
    classes = dict.fromkeys([*(c.value for c in ShardClass), *(r.shard_class for r in config.residency.classes)])
    zones: dict[str, list[str]] = {}
    for shard_class in classes:
        decision = router.policy.decide(shard_class, jurisdiction, shard_protection(config, site_id, shard_class))
        zone = router.zone_for(decision, jurisdiction)
        if zone is not None:
            zones.setdefault(zone, []).append(shard_class)
    return zones


def shard_protection(config: FederationConfig, site_id: str, shard_class: str = "") -> ShardProtection:
    """How a site's shards of ``shard_class`` are protected when they leave it (update-level
    DP ε; HE encryption when ``residency.encrypt`` names the class)."""
    update = config.privacy.update_level
    budget = config.budget_of(site_id)
    epsilon = budget.epsilon if update.enabled and budget is not None else None
    return ShardProtection(encrypted=config.residency.encrypts(shard_class), update_dp_epsilon=epsilon)


def classification_key(config: FederationConfig, plan_digest: str = "") -> str:
    """Digest of everything a shard classification depends on: the model (task, options,
    seed, layer policy, tile; and ``plan_digest`` when known) and the residency config."""
    facts = {
        "task": config.task.model_dump(mode="json"),
        "seed": config.federation.seed,
        "layers": str(config.privacy.layer_policy),
        "tile": list(config.sharding.tile),
        "plan": plan_digest,
        "residency": config.residency.model_dump(mode="json", by_alias=True),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def classify(config: FederationConfig, plan: ShardPlan, model: torch.nn.Module) -> dict[str, Classification]:
    """Shard id → class and reason, for ``model`` (whose plan is ``plan``) under the federation's residency config."""
    return SensitivityClassifier.from_config(config.residency).classify(plan, model)


def model_classes(config: FederationConfig) -> tuple[ShardPlan, dict[str, Classification]]:
    """The federation model's shard plan and classes, computed once per process and config.

    Builds the model (inside a forked RNG: torch's global generator is left as it was)
    the first time; the model itself is not kept.
    """
    key = classification_key(config)
    with _CLASSIFIED_LOCK:
        known = _CLASSIFIED.get(key)
        if known is None:
            task = load_task(config.task.target, dict(config.task.options))  # a bad target fails before torch loads
            import torch

            with torch.random.fork_rng(devices=[]):
                model = build_initial_model(task, config.federation.seed, config.privacy.layer_policy)
            plan = ShardPlan.from_state_dict(trained_state(model), config.sharding.tile)
            known = _CLASSIFIED[key] = (plan, classify(config, plan, model))
    return known


class FederationRouting:
    """The residency facts of a federation, computed once from its config.

    Parameters
    ----------
    config:
        The federation config.
    classes:
        Shard id → class, when the caller classified the model already (a site, with
        the model it holds); otherwise :func:`model_classes` on first use.
    """

    def __init__(self, config: FederationConfig, classes: Mapping[str, Classification] | None = None) -> None:
        self.config = config
        self.router = router_for(config)
        self._classes = dict(classes) if classes is not None else None

    def retarget(self, config: FederationConfig) -> None:
        """Route by ``config`` from now on: a running federation's new zones, drained zones and
        sites (:mod:`fedshard.config.changes`: its task and policy are the same, so the
        classes are kept). Sites sharing this object drop their routes to see it
        (:meth:`fedshard.site.site.Site.reroute`)."""
        self.config = config
        self.router = router_for(config)

    @property
    def plan(self) -> ShardPlan:
        """The model's shard plan."""
        return model_classes(self.config)[0]

    @property
    def classes(self) -> dict[str, Classification]:
        """Shard id → class and reason."""
        if self._classes is None:
            self._classes = dict(model_classes(self.config)[1])
        return self._classes

    def site(self, site_id: str) -> SiteRouting:
        """Routes of one site.

        Raises
        ------
        ConfigError
            If the site is unknown, a shard of it can go to no zone, or the policy would
            let the site contribute to an aggregate it may not receive itself.
        """
        try:
            site = self.config.site(site_id)
        except KeyError:
            names = ", ".join(s.id for s in self.config.sites)
            raise ConfigError(f"no site {site_id!r} in the federation (sites: {names})") from None
        try:
            decisions = [
                self.router.route(sid, c, site.jurisdiction, shard_protection(self.config, site_id, c.shard_class))
                for sid, c in self.classes.items()
            ]
        except ResidencyViolationError as exc:
            raise ResidencyViolationError(
                f"site {site_id} ({site.jurisdiction}): {exc}; add a zone in an allowed region, or change the rule"
            ) from None
        for d in decisions:
            protection = shard_protection(self.config, site_id, d.shard_class)
            decision = self.router.policy.decide(d.shard_class, site.jurisdiction, protection)
            if not decision.serves(site.jurisdiction):
                raise ConfigError(
                    f"residency: {decision.reason} — site {site_id} ({site.jurisdiction}) could never receive the "
                    f"aggregate of its own shard {d.shard_id}; add {site.jurisdiction} to that rule's serve_to"
                )
        encrypted = frozenset(d.shard_id for d in decisions if self.router.policy.encrypts(d.shard_class))
        return SiteRouting({d.shard_id: d for d in decisions}, self.router.policy.digest, encrypted)

    def check(self) -> None:
        """Route every site once, so a policy that cannot work fails at config load; with
        distributed DP noise, also refuse an aggregate that could never hold enough sites' shares."""
        members: dict[str, set[str]] = {}
        for s in self.config.sites:
            for d in self.site(s.id).routes.values():
                members.setdefault(f"{d.final_zone or d.zone}|{d.group}", set()).add(s.id)
        shared, needed = self.config.privacy.shared_noise, self.config.privacy.shares_needed
        short = sorted((len(sites), key) for key, sites in members.items() if len(sites) < needed)
        if short:
            count, key = short[0]
            name = max(shared, key=shared.__getitem__)
            raise ConfigError(
                f"aggregate {key} holds at most {count} sites' shares but privacy.{name}.distributed_over is "
                f"{needed}: its zone would refuse to publish it every round; lower distributed_over or change the "
                "residency policy so that more sites share that aggregate"
            )

    def zone_policy(self, zone_name: str, site_keys: Mapping[str, bytes] | None = None) -> ZonePolicy:
        """What zone ``zone_name`` enforces (see :class:`ZonePolicy`)."""
        zone = next((z for z in self.config.zones if z.name == zone_name), None)
        if zone is None:
            names = ", ".join(z.name for z in self.config.zones)
            raise ConfigError(f"no zone {zone_name!r} in the federation (zones: {names})")
        return ZonePolicy(
            zone=zone.name,
            region=zone.region,
            router=self.router,
            classes={sid: c.shard_class for sid, c in self.classes.items()},
            jurisdictions={s.id: s.jurisdiction for s in self.config.sites},
            protections={s.id: shard_protection(self.config, s.id) for s in self.config.sites},
            site_keys=site_keys,
            min_contributors=self.config.privacy.shares_needed,
        )


def check_regrouping(old: FederationRouting, new: FederationRouting) -> None:
    """Refuse a mid-run change of zones that cannot work: a shard of any site with no zone to
    go to, or a site of the run moved to other aggregates (its residency group's model and
    version chain are per aggregate; a change may move first hops, not aggregates).

    Raises
    ------
    ConfigError
        Naming the site and what would change.
    """
    new.check()
    for s in old.config.sites:
        before, after = old.site(s.id).view(), new.site(s.id).view()
        if before != after:
            moved = sorted(set(map(str, before)) ^ set(map(str, after)))
            raise ConfigError(
                f"site {s.id} would apply other aggregates ({', '.join(moved)}) after this change; a running "
                "federation may add or drain zones only where sites keep their aggregates (e.g. a new region's "
                "zone, or a second zone that no rule prefers)"
            )


def explain_routes(config: FederationConfig, site_id: str, tensor: str | None = None) -> list[RouteDecision]:
    """Per shard of ``site_id``'s model: class, reason, allowed regions, chosen zone."""
    routing = FederationRouting(config)
    site = routing.site(site_id)
    plan = routing.plan
    if tensor is not None and tensor not in {t.name for t in plan.tensors}:
        names = ", ".join(t.name for t in plan.tensors)
        raise ConfigError(f"the model has no tensor {tensor!r} (tensors: {names})")
    decisions = list(site.routes.values())
    if tensor is None:
        return decisions
    return [d for d in decisions if plan.shard(d.shard_id).tensor == tensor]
