"""Routing a site's shards: classify every shard, then let the policy pick its zone.

``fedshard route explain`` shows these decisions; sites will push by them, and zones
re-check them, so a shard never goes where the policy forbids.
"""

from __future__ import annotations

from fedshard.config import FederationConfig
from fedshard.errors import ConfigError
from fedshard.residency import Policy, RouteDecision, Router, SensitivityClassifier, ShardProtection, ZoneInfo
from fedshard.runtime.assembly import dp_layers
from fedshard.runtime.task import build_initial_model, load_task
from fedshard.sharding import ShardPlan

__all__ = ["explain_routes", "router_for", "shard_protection"]


def router_for(config: FederationConfig) -> Router:
    """The federation's router: its policy over its zones."""
    zones = [ZoneInfo(z.name, z.region) for z in config.zones]
    return Router(Policy.from_config(config.residency), zones, config.reducing_zone)


def shard_protection(config: FederationConfig, site_id: str) -> ShardProtection:
    """How a site's shards are protected when they leave it (update-level DP ε; no HE yet)."""
    update = config.privacy.update_level
    budget = config.budget_of(site_id)
    epsilon = budget.epsilon if update.enabled and budget is not None else None
    return ShardProtection(encrypted=False, update_dp_epsilon=epsilon)


def explain_routes(config: FederationConfig, site_id: str, tensor: str | None = None) -> list[RouteDecision]:
    """Per shard of ``site_id``'s model: class, reason, allowed regions, chosen zone."""
    try:
        site = config.site(site_id)
    except KeyError:
        names = ", ".join(s.id for s in config.sites)
        raise ConfigError(f"no site {site_id!r} in the federation (sites: {names})") from None
    task = load_task(config.task.target, dict(config.task.options))
    model = build_initial_model(task, config.federation.seed, dp_layers(config))
    plan = ShardPlan.from_state_dict(model.state_dict(), config.sharding.tile)
    if tensor is not None and tensor not in {t.name for t in plan.tensors}:
        names = ", ".join(t.name for t in plan.tensors)
        raise ConfigError(f"the model has no tensor {tensor!r} (tensors: {names})")
    classes = SensitivityClassifier.from_config(config.residency).classify(plan, model)
    decisions = router_for(config).route_plan(classes, site.jurisdiction, shard_protection(config, site_id))
    if tensor is None:
        return decisions
    return [d for d in decisions if plan.shard(d.shard_id).tensor == tensor]
