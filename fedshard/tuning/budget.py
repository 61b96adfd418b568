"""How every site's budget is split between the candidates' training and their noisy scores.

The scores' noise σ_s is fixed first: the candidates' scores together would spend
``selection_share`` of the site's ε and δ on their own (so the share says how precise the
scores are). The training then gets the largest ε at the site's δ for which the candidates'
planned steps (every candidate's rounds at the σ a site calibrates to that ε) and the scores,
composed by the site's accountant, stay within the site's ε. Composition is far from additive:
scores that alone would spend a tenth of ε = 3 add about 0.02 to the candidates' steps, so the
training calibrates σ to nearly the whole budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedshard.config import BudgetConfig
from fedshard.errors import PrivacyError
from fedshard.privacy.accountant import AccountantKind, calibrate_noise, epsilon
from fedshard.privacy.events import DPEvent, Guarantee

__all__ = ["BudgetSplit", "split_budget"]

_STEPS = 10
"""Bisection steps on the training ε: within 0.1 % of the largest one (never above it)."""


@dataclass(frozen=True)
class BudgetSplit:
    """One site's split: the budget its candidates' runs calibrate σ to (``training``), the σ of its
    noisy validation counts (``score_sigma``), and the ε the planned events compose to (``planned``)."""

    training: BudgetConfig
    score_sigma: float
    planned: float


def split_budget(
    budget: BudgetConfig,
    share: float,
    candidates: int,
    round_event: DPEvent,
    rounds: int,
    accountant: AccountantKind,
) -> BudgetSplit:
    """The split of ``budget`` for ``candidates`` whose rounds, ``rounds`` of them in all, each
    cost ``round_event``'s shape (its σ is what the split calibrates).

    Raises
    ------
    PrivacyError
        Not even ``1 − share`` of ε is left to train with (one line).
    """
    sigma_s = calibrate_noise(budget.epsilon * share, budget.delta * share, 1.0, candidates, accountant)
    scores = DPEvent(Guarantee.RECORD, sigma_s, 1.0, candidates)
    steps = round_event.steps * rounds

    def planned(training: float) -> float:
        sigma = calibrate_noise(training, budget.delta, round_event.sample_rate, steps, accountant)
        training_steps = DPEvent(Guarantee.RECORD, sigma, round_event.sample_rate, steps)
        return epsilon([training_steps, scores], budget.delta, accountant)

    low, high = budget.epsilon * (1.0 - share), budget.epsilon
    spent = planned(low)
    if spent > budget.epsilon:
        raise PrivacyError(
            f"the candidates' {rounds} rounds and {candidates} scores would spend ε {spent:.3g} of {budget.epsilon:g}: "
            "give the scores a larger selection_share or tune fewer rounds"
        )
    for _ in range(_STEPS):
        middle = (low + high) / 2
        at_middle = planned(middle)
        if at_middle <= budget.epsilon:
            low, spent = middle, at_middle
        else:
            high = middle
    return BudgetSplit(BudgetConfig(epsilon=low, delta=budget.delta), sigma_s, spent)
