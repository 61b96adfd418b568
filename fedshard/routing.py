"""Routing a federation's shards: classify every shard, then let the policy pick its zone.

Everything here is derived from the federation config alone, deterministically, so a
site, a zone and ``fedshard route explain`` reach the same decisions independently:
sites push by them, zones re-check them (:func:`zone_policy_for`), so a shard never
goes where the policy forbids.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

from fedshard.config import FederationConfig
from fedshard.errors import ConfigError
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
from fedshard.task import build_initial_model, load_task
from fedshard.zone.policy import ZonePolicy

__all__ = [
    "FederationRouting",
    "explain_routes",
    "router_for",
    "shard_protection",
]


def router_for(config: FederationConfig) -> Router:
    """The federation's router: its policy over its zones."""
    zones = [ZoneInfo(z.name, z.region) for z in config.zones]
    return Router(Policy.from_config(config.residency), zones, config.reducing_zone)


def shard_protection(config: FederationConfig, site_id: str, shard_class: str = "") -> ShardProtection:
    """How a site's shards of ``shard_class`` are protected when they leave it (update-level
    DP ε; CKKS encryption when ``residency.encrypt`` names the class)."""
    update = config.privacy.update_level
    budget = config.budget_of(site_id)
    epsilon = budget.epsilon if update.enabled and budget is not None else None
    return ShardProtection(encrypted=config.residency.encrypts(shard_class), update_dp_epsilon=epsilon)


class FederationRouting:
    """The residency facts of a federation, computed once from its config.

    Building the model (for the classifier's detectors) is the expensive part; it
    happens on first use.
    """

    def __init__(self, config: FederationConfig) -> None:
        self.config = config
        self.router = router_for(config)

    @cached_property
    def _model_plan(self) -> tuple[ShardPlan, dict[str, Classification]]:
        config = self.config
        task = load_task(config.task.target, dict(config.task.options))
        model = build_initial_model(task, config.federation.seed, config.privacy.layer_policy)
        plan = ShardPlan.from_state_dict(model.state_dict(), config.sharding.tile)
        classes = SensitivityClassifier.from_config(config.residency).classify(plan, model)
        return plan, classes

    @property
    def plan(self) -> ShardPlan:
        """The model's shard plan."""
        return self._model_plan[0]

    @property
    def classes(self) -> dict[str, Classification]:
        """Shard id → class and reason."""
        return self._model_plan[1]

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
        decisions = [
            self.router.route(sid, c, site.jurisdiction, shard_protection(self.config, site_id, c.shard_class))
            for sid, c in self.classes.items()
        ]
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
        """Route every site once, so a policy that cannot work fails at config load."""
        for s in self.config.sites:
            self.site(s.id)

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
            min_contributors=self.config.privacy.update_level.distributed_over or 1
            if self.config.privacy.update_level.enabled
            else 1,
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
