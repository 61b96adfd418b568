"""What the coordinator asks of sites, from the federation config: the privacy plan of
each site and the server-side optimiser sites apply aggregates with."""

from __future__ import annotations

from fedshard.aggregation.server_rules import rule as server_rule
from fedshard.config import FederationConfig
from fedshard.privacy.accountant import AccountantKind
from fedshard.protocol.messages import ApplyRule, PrivacyPlan, RecordPlan, UpdatePlan

__all__ = ["apply_rule", "privacy_plan"]


def apply_rule(config: FederationConfig) -> ApplyRule:
    """The server-side optimiser every site applies aggregates with (``training.server_optimizer``).

    Raises
    ------
    ConfigError
        It names no registered rule.
    """
    rule = config.training.server_optimizer
    return ApplyRule(
        kind=server_rule(rule.kind).name,
        learning_rate=rule.learning_rate,
        beta1=rule.beta1,
        beta2=rule.beta2,
        tau=rule.tau,
    )


def privacy_plan(config: FederationConfig, site_id: str) -> PrivacyPlan | None:
    """The privacy the aggregator asks of ``site_id`` (None when DP is off)."""
    p = config.privacy
    if not p.enabled:
        return None
    budget = config.budget_of(site_id)
    assert budget is not None  # validated: a budget exists whenever DP is on
    t = config.training
    record = p.record_level
    return PrivacyPlan(
        accountant=AccountantKind(record.accountant),
        epsilon=budget.epsilon,
        delta=budget.delta,
        batch_size=t.sent_batch_size,
        epochs=t.local_epochs,
        record=RecordPlan(
            mechanism=record.mechanism,
            noise_multiplier=record.noise_multiplier,
            max_grad_norm=record.max_grad_norm,
            planned_rounds=config.planned_rounds,
            distributed_over=record.distributed_over,
            sample_rate=record.sample_rate,
        )
        if record.enabled
        else None,
        update=UpdatePlan(
            mechanism=p.update_level.mechanism,
            clip_norm=p.update_level.clip_norm,
            noise_multiplier=p.update_level.noise_multiplier,
            distributed_over=p.update_level.distributed_over,
        )
        if p.update_level.enabled
        else None,
    )
