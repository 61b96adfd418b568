"""Which sites take part in a round, and with what weight."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping

from fedshard.config import FederationConfig
from fedshard.coordinator._reports import PrivacyReports
from fedshard.errors import RoundError
from fedshard.protocol.messages import SiteInfo
from fedshard.protocol.rounds import derive_seed

__all__ = ["fixed_weights", "select_sites"]


def select_sites(
    config: FederationConfig, nodes: Mapping[str, SiteInfo], privacy: PrivacyReports, rnd: int
) -> list[str]:
    """Sample round ``rnd``'s nodes among those whose site can still afford a round.

    Raises
    ------
    RoundError
        Fewer than ``federation.min_sites`` can (naming those whose budget is exhausted).
    """
    fed = config.federation
    ordered = sorted(nodes, key=lambda n: nodes[n].site_id)
    eligible = [n for n in ordered if privacy.can_afford(nodes[n].site_id)]
    if len(eligible) < fed.min_sites:
        spent = sorted(nodes[n].site_id for n in ordered if n not in eligible)
        why = f"; privacy budget exhausted: {', '.join(spent)}" if spent else ""
        raise RoundError(
            f"round {rnd}: only {len(eligible)} site(s) can still take part, "
            f"federation.min_sites is {fed.min_sites}{why}"
        )
    k = max(fed.min_sites, math.ceil(fed.sample_fraction * len(eligible)))
    # One generator per round: a resumed run selects as the uninterrupted one would have.
    rng = random.Random(derive_seed(fed.seed, rnd, "selection"))
    return sorted(rng.sample(eligible, min(k, len(eligible))))


def fixed_weights(config: FederationConfig, nodes: Mapping[str, SiteInfo]) -> dict[str, float]:
    """Node → the aggregation weight the coordinator fixes for its site: the examples it
    reported, capped at ``aggregation.max_weight_over_median`` times the lower median of
    what all the federation's sites reported (a site that over-reports moves that median by
    one place at most) and at ``aggregation.max_site_weight`` (zones refuse any other weight)."""
    rule = config.aggregation
    reported = [max(info.num_examples, 1) for info in nodes.values()]
    median = float(statistics.median_low(reported)) if reported else None
    return {node: rule.fixed_weight(info.num_examples, median) for node, info in nodes.items()}
