"""Which sites take part in a round, with what weight, and what their evaluations add up to."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from fedshard.config import FederationConfig
from fedshard.coordinator.reports import PrivacyReports
from fedshard.errors import RoundError
from fedshard.protocol.messages import EvaluateReport, SiteInfo
from fedshard.protocol.rounds import derive_seed

__all__ = ["fixed_weights", "select_sites", "weighted_evaluation"]


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
    reported, capped by ``aggregation.max_site_weight`` (zones refuse any other weight)."""
    rule = config.aggregation
    return {node: rule.fixed_weight(info.num_examples) for node, info in nodes.items()}


def weighted_evaluation(
    rnd: int, reports: Sequence[EvaluateReport], expected: Mapping[str, str]
) -> tuple[float, float]:
    """Accuracy and loss weighted over the sites' test records (NaN when none reported).

    Raises
    ------
    RoundError
        A site reports another model version than ``expected`` (site id → version).
    """
    disagree = [r.site_id for r in reports if r.version != expected.get(r.site_id)]
    if disagree:
        raise RoundError(f"round {rnd}: sites {', '.join(disagree)} report a different model version")
    n = sum(r.num_examples for r in reports)
    if n == 0:
        return float("nan"), float("nan")
    return (
        sum(r.accuracy * r.num_examples for r in reports) / n,
        sum(r.loss * r.num_examples for r in reports) / n,
    )
