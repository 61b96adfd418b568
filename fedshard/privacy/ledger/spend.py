"""The ledger's arithmetic: ε spent, what events would cost, how many more rounds fit.

Pure functions of a :class:`Snapshot` (the budget and every stored entry, read in one
transaction) and the accountant; nothing here touches the file. They are conservative:
ε spent counts every reserved event, committed or not, and is never less than an ε the
ledger has already recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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

    ε grows with k. The search keeps a bracket (k that fits, k that does not) and probes
    where ε² of the composition, close to linear in the steps for Gaussian mechanisms,
    says ε reaches the budget (:func:`_aim`); where three such probes in a row do not
    halve the bracket a bisection follows, so a poor model costs O(log k) compositions.
    It starts at ``hint`` (a guess: the last answer, one round on), then its neighbour:
    two compositions when the guess is right. Without one it starts at 1: a fresh
    ledger's 1,362 rounds (RDP, σ 1, q 0.01) take 7 compositions where doubling then
    bisecting took 22, and one with 23 rounds left (σ 0.9, q 0.05) 4 where it took 10.
    Every candidate is composed: a wrong hint or model costs time, never a wrong answer.
    """
    guarantees = sorted({event.guarantee for event in next_round})
    if not guarantees:
        return MAX_PROJECTED_ROUNDS
    budget = snapshot.budget.epsilon
    known: dict[int, float] = {}  # k -> the largest ε over the guarantees, were k more rounds added

    def eps(k: int) -> float:
        if k not in known:
            if k == 0:  # what is spent already (no composition for a fresh ledger)
                known[k] = max(epsilon_of(snapshot, g, [], accountant) for g in guarantees)
            else:  # k rounds of the same events compose like one round with k times the steps
                scaled = [replace(event, steps=event.steps * k) for event in next_round]
                known[k] = max(cost(snapshot, scaled, accountant).values())
        return known[k]

    cap = MAX_PROJECTED_ROUNDS
    lo, hi = 0, cap + 1  # invariant: lo rounds fit (0 always does), hi do not (cap + 1 is never composed)
    probe = min(max(hint or 1, 1), cap)
    guessed, aimed, slow = bool(hint), False, 0
    while True:
        width = hi - lo
        if eps(probe) <= budget:
            lo = probe
        else:
            hi = probe
        if hi - lo <= 1:
            return lo
        slow = slow + 1 if aimed and 2 * (hi - lo) > width else 0
        if guessed:  # a guess: its neighbour settles it when it was right
            probe, guessed = (lo + 1 if lo == probe else hi - 1), False
        elif slow >= 3 and hi <= cap:  # three of the model's probes in a row did not halve the bracket
            probe, aimed, slow = (lo + hi) // 2, False, 0
        else:
            probe, aimed = min(max(_aim(known, lo, hi, budget, eps), lo + 1), hi - 1), True


def _aim(known: dict[int, float], lo: int, hi: int, budget: float, eps: Callable[[int], float]) -> int:
    """The largest k whose ε fits ``budget`` where ε² is linear in k through two points: the
    bracket's ends where its upper end was composed, else the two largest composed points
    that fit (0, what is spent, if only one); twice the larger point where ε does not grow."""
    if hi in known:
        a, b = lo, hi
    else:
        fit = sorted(k for k in known if k <= lo)
        a, b = (fit[-2], fit[-1]) if len(fit) >= 2 else (0, lo)
    ea, eb = eps(a) ** 2, eps(b) ** 2
    if not eb > ea:
        return 2 * b
    aim = a + (budget**2 - ea) * (b - a) / (eb - ea)
    return int(aim) if math.isfinite(aim) and aim < 2**62 else 2**62
