"""Property test of the privacy ledger: random reserve / commit / crash / reopen / lower-budget runs.

Invariants checked after every step:

* ε spent never exceeds the budget that was in force when it was last charged, and a
  reservation is accepted exactly when it fits the current budget;
* ε spent never decreases, across operations, reopens and crashes;
* the ledger is append-only: every earlier entry is still there, unchanged, and a
  committed one stays committed (no committed event is ever lost);
* a reopened or crash-recovered ledger reports exactly the entries it had.

A "crash" copies the database file and its write-ahead log while the ledger is open,
often with a reservation uncommitted, and continues on the copy: that is what a power
cut leaves on disk, since every transaction is synced before it returns.

The RDP accountant keeps this fast; the ledger's logic does not depend on which one.
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fedshard.errors import BudgetExhaustedError, PrivacyError
from fedshard.privacy.accountant import AccountantKind, epsilon
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import Budget, LedgerEntry, PrivacyLedger, Reservation

RDP = AccountantKind.RDP

events = st.builds(
    DPEvent,
    guarantee=st.sampled_from(Guarantee),
    noise_multiplier=st.sampled_from([0.9, 1.5, 3.0, 8.0]),
    sample_rate=st.sampled_from([0.01, 0.05, 0.2, 1.0]),
    steps=st.integers(1, 20),
)
budgets = st.builds(Budget, epsilon=st.floats(0.5, 12.0), delta=st.sampled_from([1e-6, 1e-5]))


def _frozen(entry: LedgerEntry) -> tuple[object, ...]:
    """An entry without its commit flag: the part that must never change."""
    return (entry.seq, entry.round, entry.event, entry.epsilon_after, entry.delta, entry.created_at)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)
        self.copies = itertools.count()
        self.clock = itertools.count(1)
        self.ledger: PrivacyLedger | None = None
        self.path = self.root / "ledger.sqlite"
        self.budget = Budget(1.0, 1e-5)
        self.cap = dict.fromkeys(Guarantee, 0.0)  # budget ε in force at the last charge of each guarantee
        self.spent = dict.fromkeys(Guarantee, 0.0)
        self.entries: list[LedgerEntry] = []
        self.committed: set[int] = set()
        self.uncommitted: list[Reservation] = []
        self.next_round = 0

    def _open(self, budget: Budget) -> PrivacyLedger:
        return PrivacyLedger(self.path, budget, accountant=RDP, clock=lambda: float(next(self.clock)))

    @property
    def opened(self) -> PrivacyLedger:
        assert self.ledger is not None
        return self.ledger

    @initialize(budget=budgets)
    def start(self, budget: Budget) -> None:
        self.budget = budget
        self.ledger = self._open(budget)

    def teardown(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
        self._tmp.cleanup()

    # -- operations ----------------------------------------------------------------

    @rule(new=st.lists(events, min_size=1, max_size=3))
    def reserve(self, new: list[DPEvent]) -> None:
        round_ = self.next_round
        before = self.opened.entries()
        try:
            reservation = self.opened.reserve(round_, new)
        except BudgetExhaustedError:
            # Refused exactly when some guarantee would overrun (counting every event so far).
            over = False
            for g in {event.guarantee for event in new}:
                composed = [e.event for e in before if e.event.guarantee is g] + [e for e in new if e.guarantee is g]
                over |= max(self.spent[g], epsilon(composed, self.budget.delta, RDP)) > self.budget.epsilon
            assert over, "reservation refused although it fits the budget"
            assert self.opened.entries() == before, "a refused reservation wrote something"
            event("reservation refused")
            return
        self.next_round += 1
        assert len(reservation.seqs) == len(new)
        for g, eps in reservation.epsilon_after.items():
            composed = [e.event for e in before if e.event.guarantee is g] + [e for e in new if e.guarantee is g]
            assert eps <= self.budget.epsilon, "accepted a reservation over the budget"
            assert eps >= epsilon(composed, self.budget.delta, RDP), "epsilon_after is optimistic"
            self.cap[g] = self.budget.epsilon
        self.uncommitted.append(reservation)

    @precondition(lambda self: self.next_round > 0)
    @rule(data=st.data())
    def reserve_a_round_again(self, data: st.DataObject) -> None:
        before = self.opened.entries()
        round_ = data.draw(st.integers(0, self.next_round - 1))
        with pytest.raises(PrivacyError, match="already has a reservation"):
            self.opened.reserve(round_, [DPEvent(Guarantee.UPDATE, 100.0, 0.001, 1)])
        assert self.opened.entries() == before

    @precondition(lambda self: bool(self.uncommitted))
    @rule(data=st.data(), twice=st.booleans())
    def commit(self, data: st.DataObject, twice: bool) -> None:
        reservation = self.uncommitted.pop(data.draw(st.integers(0, len(self.uncommitted) - 1)))
        self.opened.commit(reservation)
        if twice:
            self.opened.commit(reservation)
        self.committed.update(reservation.seqs)

    @rule(eps=st.floats(0.5, 12.0), delta_factor=st.sampled_from([1.0, 10.0]))
    def reopen(self, eps: float, delta_factor: float) -> None:
        """Close (the process ends, maybe before committing) and open again, proposing a budget."""
        budget = Budget(eps, min(0.5, self.budget.delta * delta_factor))  # δ is lowered in the unit tests
        before = self.opened.entries()
        self.opened.close()
        self.ledger = self._open(budget)
        self.budget = Budget(min(self.budget.epsilon, budget.epsilon), self.budget.delta)
        assert self.opened.entries() == before
        assert self.opened.budget == self.budget

    @rule(abandon=st.booleans())
    def crash(self, abandon: bool) -> None:
        """Power cut: continue on a copy of what is on disk now (database file and WAL)."""
        before = self.opened.entries()
        target = self.root / f"crashed-{next(self.copies)}.sqlite"
        for suffix in ("", "-wal"):
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                shutil.copyfile(source, Path(f"{target}{suffix}"))
        event(f"crash with {len(self.uncommitted)} uncommitted" if len(self.uncommitted) < 2 else "crash with 2+")
        self.opened.close()
        self.path = target
        self.ledger = self._open(self.budget)
        assert self.opened.entries() == before
        if abandon:  # the restarted site never learns whether these were released
            self.uncommitted.clear()

    @rule(factor=st.floats(0.3, 1.5), delta_factor=st.sampled_from([1.0, 10.0]))
    def lower_budget(self, factor: float, delta_factor: float) -> None:
        proposed = Budget(self.budget.epsilon * factor, min(0.5, self.budget.delta * delta_factor))
        effective = self.opened.lower_budget(proposed)
        self.budget = Budget(min(self.budget.epsilon, proposed.epsilon), self.budget.delta)
        assert effective == self.budget == self.opened.budget

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def spend_is_within_budget_and_never_shrinks(self) -> None:
        if self.ledger is None:
            return
        status = self.opened.status()
        for g in Guarantee:
            spent = status.spent[g]
            assert math.isfinite(spent)
            assert spent <= self.cap[g], f"{g} spent {spent} over the budget {self.cap[g]}"
            assert spent >= self.spent[g], f"{g} spent went down: {self.spent[g]} -> {spent}"
            assert status.remaining[g] == max(0.0, self.budget.epsilon - spent)
            self.spent[g] = spent
        assert status.budget == self.budget
        assert set(status.pending) == {e.round for e in self.opened.entries() if not e.committed}
        assert set(status.pending) >= {r.round for r in self.uncommitted}

    @invariant()
    def history_is_append_only_and_commits_are_kept(self) -> None:
        if self.ledger is None:
            return
        entries = self.opened.entries()
        assert [_frozen(e) for e in entries[: len(self.entries)]] == [_frozen(e) for e in self.entries]
        for old, new in zip(self.entries, entries, strict=False):
            assert new.committed or not old.committed, f"commit of event {old.seq} was lost"
        assert {e.seq for e in entries if e.committed} == self.committed
        assert len({e.round for e in entries}) == self.next_round == self.opened.status().rounds_participated
        self.entries = entries


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)
TestLedgerMachine = LedgerMachine.TestCase
