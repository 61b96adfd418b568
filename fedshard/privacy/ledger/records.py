"""What the privacy ledger takes and gives: budgets, reservations, stored entries and status.

Immutable values; the ledger (:class:`~fedshard.privacy.ledger.PrivacyLedger`) builds
them from its file and never changes one once handed out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedshard.errors import ConfigError
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import DPEvent, Guarantee

__all__ = ["CARRIED_ROUND", "Budget", "LedgerEntry", "LedgerHead", "LedgerStatus", "Reservation"]

CARRIED_ROUND = -1
"""The round of the events a recovered ledger carries forward from the ledger it replaces."""


@dataclass(frozen=True, slots=True)
class Budget:
    """A site's (ε, δ) privacy budget, per guarantee.

    Parameters
    ----------
    epsilon:
        Finite, > 0.
    delta:
        In (0, 1).

    Raises
    ------
    ConfigError
        If a value is out of range (one line naming it).
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        eps, delta = self.epsilon, self.delta
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not (math.isfinite(eps) and eps > 0):
            raise ConfigError(f"privacy budget epsilon must be finite and > 0, got {eps!r}")
        if isinstance(delta, bool) or not isinstance(delta, int | float) or not (0 < delta < 1):
            raise ConfigError(f"privacy budget delta must be in (0, 1), got {delta!r}")
        object.__setattr__(self, "epsilon", float(eps))
        object.__setattr__(self, "delta", float(delta))

    def to_dict(self) -> dict[str, float]:
        """JSON-friendly form: ``{"epsilon", "delta"}``."""
        return {"epsilon": self.epsilon, "delta": self.delta}


@dataclass(frozen=True, slots=True)
class Reservation:
    """Events of one round written to the ledger, to be committed once released.

    Attributes
    ----------
    round:
        The round the events belong to.
    seqs:
        Ledger sequence numbers of the events.
    epsilon_after:
        ε spent per guarantee once these events count.
    """

    round: int
    seqs: tuple[int, ...]
    epsilon_after: Mapping[Guarantee, float]


@dataclass(frozen=True, slots=True)
class LedgerHead:
    """Where a ledger's MAC chain ends: what the site anchors outside the file.

    Attributes
    ----------
    ledger_id:
        The ledger's random id (a new one for a ledger built by recovery).
    length:
        Rows in the chain (budget, event and commit rows).
    mac:
        The MAC of the last row (hex); the MAC of the ledger's identity when ``length`` is 0.
    """

    ledger_id: str
    length: int
    mac: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"ledger_id": self.ledger_id, "length": self.length, "mac": self.mac}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> LedgerHead:
        """The head :meth:`to_dict` wrote.

        Raises
        ------
        ValueError
            If ``doc`` is not one.
        """
        try:
            head = cls(str(doc["ledger_id"]), int(doc["length"]), str(doc["mac"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"not a ledger head: {doc!r}") from None
        if head.length < 0:
            raise ValueError(f"not a ledger head: {doc!r}")
        return head


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One stored event, as :meth:`PrivacyLedger.entries` reports it (``round`` is
    :data:`CARRIED_ROUND` for an event carried forward by recovery)."""

    seq: int
    round: int
    event: DPEvent
    epsilon_after: float
    delta: float
    committed: bool
    created_at: float


@dataclass(frozen=True, slots=True)
class LedgerStatus:
    """What a site has spent and what it can still afford.

    Attributes
    ----------
    budget:
        The effective budget (the lowest ever set).
    accountant:
        The accountant ε is computed with.
    spent, remaining:
        ε per guarantee; ``remaining`` is never negative.
    rounds_participated:
        Distinct rounds with any reserved event, committed or not.
    pending:
        Rounds reserved but not (fully) committed.
    can_afford_next:
        Whether one more round costing ``next_round`` fits the budget (``True``
        when no next round was described).
    projected_rounds_left:
        How many more such rounds fit (at most
        :data:`~fedshard.privacy.ledger.MAX_PROJECTED_ROUNDS`); ``None`` when no next
        round was described.
    """

    budget: Budget
    accountant: AccountantKind
    spent: Mapping[Guarantee, float]
    remaining: Mapping[Guarantee, float]
    rounds_participated: int
    pending: tuple[int, ...]
    can_afford_next: bool
    projected_rounds_left: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (guarantees as their string values)."""
        return {
            "budget": self.budget.to_dict(),
            "accountant": self.accountant.value,
            "spent": {g.value: eps for g, eps in self.spent.items()},
            "remaining": {g.value: eps for g, eps in self.remaining.items()},
            "rounds_participated": self.rounds_participated,
            "pending": list(self.pending),
            "can_afford_next": self.can_afford_next,
            "projected_rounds_left": self.projected_rounds_left,
        }
