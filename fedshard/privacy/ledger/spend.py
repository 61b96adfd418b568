"""The ledger's arithmetic: ε spent, what events would cost, how many more rounds fit.

Pure functions of a :class:`Snapshot` (the budget and every stored entry, read in one
transaction) and the accountant; nothing here touches the file. They are conservative:
ε spent counts every reserved event, committed or not, and is never less than an ε the
ledger has already recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from fedshard.errors import PrivacyError
from fedshard.privacy.accountant import AccountantKind, epsilon
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger.records import Budget, LedgerEntry

__all__ = ["MAX_PROJECTED_ROUNDS", "Snapshot", "check_events", "cost", "epsilon_of", "project"]

MAX_PROJECTED_ROUNDS = 10_000
""":attr:`LedgerStatus.projected_rounds_left` stops counting here."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The effective budget and every stored entry, as one transaction saw them."""

    budget: Budget
    entries: tuple[LedgerEntry, ...]


def check_events(events: Sequence[DPEvent]) -> tuple[DPEvent, ...]:
    """``events`` as a tuple, after checking that each is a :class:`DPEvent`.

    Raises
    ------
    PrivacyError
        If one is not.
    """
    checked = tuple(events)
    for event in checked:
        if not isinstance(event, DPEvent):
            raise PrivacyError(f"expected DPEvent, got {event!r}")
    return checked


def epsilon_of(snapshot: Snapshot, guarantee: Guarantee, extra: Sequence[DPEvent], accountant: AccountantKind) -> float:
    """ε under ``guarantee`` of the stored events plus ``extra``, at the effective δ.

    Never less than the largest ε already recorded under ``guarantee`` (an accountant
    change cannot shrink what was spent).
    """
    mine = [entry for entry in snapshot.entries if entry.event.guarantee is guarantee]
    recorded = max((entry.epsilon_after for entry in mine), default=0.0)
    events = [entry.event for entry in mine] + [event for event in extra if event.guarantee is guarantee]
    return max(recorded, epsilon(events, snapshot.budget.delta, accountant))


def cost(snapshot: Snapshot, events: Sequence[DPEvent], accountant: AccountantKind) -> dict[Guarantee, float]:
    """``{guarantee: ε after}`` for each guarantee involved in ``events``, were they added."""
    involved = sorted({event.guarantee for event in events})
    return {g: epsilon_of(snapshot, g, events, accountant) for g in involved}


def project(
    snapshot: Snapshot, next_round: Sequence[DPEvent], accountant: AccountantKind, hint: int | None = None
) -> int:
    """Largest k <= :data:`MAX_PROJECTED_ROUNDS` such that k more rounds of ``next_round`` fit.

    ε grows with k, so a galloping search from ``hint`` (a guess: the last answer, one
    round on; 1 without one) then a bisection find k in O(log |k − hint|) compositions:
    two when the guess is right. Every candidate is composed: a wrong hint costs time,
    never a wrong answer.
    """

    def fits(k: int) -> bool:
        # k rounds of the same events compose like one round with k times the steps.
        scaled = [replace(event, steps=event.steps * k) for event in next_round]
        return all(eps <= snapshot.budget.epsilon for eps in cost(snapshot, scaled, accountant).values())

    start = min(max(hint or 1, 1), MAX_PROJECTED_ROUNDS)
    step = 1
    if fits(start):  # gallop up: low fits
        low = start
        while True:
            high = low + step
            if high > MAX_PROJECTED_ROUNDS:
                if fits(MAX_PROJECTED_ROUNDS):
                    return MAX_PROJECTED_ROUNDS
                high = MAX_PROJECTED_ROUNDS
                break
            if not fits(high):
                break
            low, step = high, step * 2
    else:  # gallop down: high does not fit
        high = start
        while True:
            low = high - step
            if low < 1:
                if not fits(1):
                    return 0
                low = 1
                break
            if fits(low):
                break
            high, step = low, step * 2
    while high - low > 1:  # invariant: fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
