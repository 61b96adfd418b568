"""The registered parts a federation config names (server optimiser, accountant, DP
mechanisms, homomorphic scheme), checked in one place before anything runs: a name nobody registered is
refused in one line naming those that exist, by ``fedshard simulate`` and by the
aggregator host alike. A task registers its own parts when its module is imported."""

from __future__ import annotations

from fedshard.aggregation.server_rules import rule as server_rule
from fedshard.config import FederationConfig
from fedshard.crypto.he_schemes import SCHEMES
from fedshard.privacy.accountants import accountant
from fedshard.privacy.mechanisms import check_configured

__all__ = ["check_parts"]


def check_parts(config: FederationConfig) -> None:
    """Raise :class:`~fedshard.errors.ConfigError` if ``config`` names a server optimiser, an
    accountant, a DP mechanism (of the right guarantee) or, where shards are encrypted, a
    homomorphic scheme that is not registered."""
    server_rule(config.training.server_optimizer.kind)
    privacy = config.privacy
    if privacy.enabled:
        accountant(privacy.record_level.accountant)
    check_configured(privacy)
    if config.residency.encrypting:
        SCHEMES.get_part(config.he.scheme)
