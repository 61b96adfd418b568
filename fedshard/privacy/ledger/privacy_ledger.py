"""The :class:`PrivacyLedger`: reserve a round's DP events before release, commit them after.

The reading side (:meth:`PrivacyLedger.status`, :meth:`~PrivacyLedger.spent`,
:meth:`~PrivacyLedger.cost`, :meth:`~PrivacyLedger.entries`) and the writing side
(:meth:`~PrivacyLedger.reserve`, :meth:`~PrivacyLedger.commit`,
:meth:`~PrivacyLedger.lower_budget`) each run in one SQLite transaction; the arithmetic is
in :mod:`~fedshard.privacy.ledger.spend`, the rows in :mod:`~fedshard.privacy.ledger.rows`
and the file in :mod:`~fedshard.privacy.ledger.schema`. The guarantees are described in
:mod:`fedshard.privacy.ledger`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType

from fedshard.errors import BudgetExhaustedError, ConfigError, PrivacyError, StoreError
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import rows, spend
from fedshard.privacy.ledger.records import Budget, LedgerEntry, LedgerStatus, Reservation
from fedshard.privacy.ledger.schema import create, open_checked
from fedshard.privacy.ledger.spend import Snapshot, check_events

__all__ = ["PrivacyLedger"]


class PrivacyLedger:
    """A site's persistent record of DP events, refusing any that overrun its budget.

    Parameters
    ----------
    path:
        The SQLite file; created (with its parent directory) if it does not exist.
    budget:
        The site's budget. If the ledger already holds a lower one, that one stays
        in force (see :attr:`budget`); a lower one given here lowers it for good.
        None opens an existing ledger as it is (to inspect it).
    accountant:
        The Opacus accountant used to compute ε (default: the one the ledger was
        created with, PRV for a new ledger).
    clock:
        Source of timestamps (seconds since the epoch); passed in for tests.

    Raises
    ------
    StoreError
        If the file is corrupt, not a ledger, of a newer format, or unreadable; the
        file is left as it was.
    ConfigError
        If ``budget`` is not a :class:`Budget`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        budget: Budget | None,
        *,
        accountant: AccountantKind | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if budget is not None and not isinstance(budget, Budget):
            raise ConfigError(f"budget must be a Budget(epsilon, delta), got {budget!r}")
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        if not self.path.exists():
            if budget is None:
                raise StoreError(f"no privacy ledger at {self.path}: the site has not taken part in a DP round yet")
            create(
                self.path, budget.epsilon, budget.delta, AccountantKind(accountant or AccountantKind.PRV).value, clock()
            )
        self._conn = open_checked(self.path)
        try:
            stored = self._conn.execute("SELECT value FROM meta WHERE key = 'accountant'").fetchone()
            self.accountant = AccountantKind(accountant or (stored[0] if stored else AccountantKind.PRV))
            if budget is not None:
                self.lower_budget(budget)
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the file; safe to call twice."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> PrivacyLedger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------

    @property
    def budget(self) -> Budget:
        """The effective budget: the lowest ε and the lowest δ ever given."""
        with self._read() as conn:
            return rows.read_budget(conn)

    def entries(self) -> list[LedgerEntry]:
        """Every stored event, oldest first, with its commit state.

        Returns
        -------
        list of LedgerEntry
        """
        with self._read() as conn:
            return list(rows.read_entries(conn, self.path))

    def spent(self, guarantee: Guarantee) -> float:
        """ε spent under ``guarantee`` over all its events, committed or not.

        Parameters
        ----------
        guarantee:
            Record- or update-level.

        Returns
        -------
        float
            ε at the effective δ (0.0 if none).
        """
        return spend.epsilon_of(self._snapshot(), Guarantee(guarantee), (), self.accountant)

    def cost(self, events: Sequence[DPEvent]) -> dict[Guarantee, float]:
        """ε per guarantee involved in ``events`` if they were added; nothing is written.

        Parameters
        ----------
        events:
            Candidate events.

        Returns
        -------
        dict
            ``{guarantee: epsilon_after}`` for each guarantee in ``events``.
        """
        return spend.cost(self._snapshot(), check_events(events), self.accountant)

    def status(self, next_round: Sequence[DPEvent] = ()) -> LedgerStatus:
        """Budget, spend and what is left, optionally for rounds costing ``next_round``.

        Parameters
        ----------
        next_round:
            The events one more round would add; empty to skip the projection.

        Returns
        -------
        LedgerStatus
        """
        snapshot = self._snapshot()
        spent = {g: spend.epsilon_of(snapshot, g, (), self.accountant) for g in Guarantee}
        remaining = {g: max(0.0, snapshot.budget.epsilon - eps) for g, eps in spent.items()}
        pending = sorted({entry.round for entry in snapshot.entries if not entry.committed})
        projected: int | None = None
        can_afford = True
        if next_round:
            projected = spend.project(snapshot, check_events(next_round), self.accountant)
            can_afford = projected >= 1
        return LedgerStatus(
            budget=snapshot.budget,
            accountant=self.accountant,
            spent=spent,
            remaining=remaining,
            rounds_participated=len({entry.round for entry in snapshot.entries}),
            pending=tuple(pending),
            can_afford_next=can_afford,
            projected_rounds_left=projected,
        )

    # -- writing ---------------------------------------------------------------------

    def reserve(self, round: int, events: Sequence[DPEvent]) -> Reservation:
        """Record ``events`` for ``round`` if the budget allows them, before anything is released.

        Parameters
        ----------
        round:
            Round number (>= 0); each round is reserved at most once.
        events:
            The round's DP events (at least one).

        Returns
        -------
        Reservation
            To pass to :meth:`commit` once the round's update has been sent.

        Raises
        ------
        BudgetExhaustedError
            If ε after the events would exceed the budget under some guarantee;
            nothing is written and nothing may be released.
        PrivacyError
            If ``events`` is empty or ``round`` already has a reservation.
        """
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise PrivacyError(f"round must be an integer >= 0, got {round!r}")
        new = check_events(events)
        if not new:
            raise PrivacyError(f"round {round}: a reservation needs at least one DP event")
        with self._write() as conn:
            snapshot = Snapshot(rows.read_budget(conn), rows.read_entries(conn, self.path))
            if any(entry.round == round for entry in snapshot.entries):
                raise PrivacyError(f"round {round} already has a reservation; a round is charged once")
            after = spend.cost(snapshot, new, self.accountant)
            for guarantee, eps in after.items():
                if eps > snapshot.budget.epsilon:
                    raise BudgetExhaustedError(
                        f"round {round} would take {guarantee.value}-level ε to {eps:.6g}, over the budget "
                        f"{snapshot.budget.epsilon:.6g} (δ={snapshot.budget.delta:g}); nothing was released"
                    )
            seqs = rows.insert_events(conn, round, new, snapshot.budget.delta, after, self._clock())
        return Reservation(round=round, seqs=seqs, epsilon_after=after)

    def commit(self, reservation: Reservation) -> None:
        """Mark a reservation's events as released; committing twice is harmless.

        Parameters
        ----------
        reservation:
            As returned by :meth:`reserve` (possibly by an earlier process).

        Raises
        ------
        PrivacyError
            If the ledger holds no such reservation.
        """
        seqs = sorted(set(reservation.seqs))
        with self._write() as conn:
            stored = rows.round_of_events(conn, seqs)
            if not seqs or len(stored) != len(seqs) or any(r != reservation.round for r in stored.values()):
                raise PrivacyError(f"{self.path} holds no reservation of round {reservation.round} with events {seqs}")
            rows.insert_commits(conn, seqs, self._clock())

    def lower_budget(self, budget: Budget) -> Budget:
        """Lower the effective budget to ``budget`` where it is lower; never raise it.

        ε and δ are each kept at the minimum of every value ever given.

        Parameters
        ----------
        budget:
            The proposed budget (e.g. sent by the aggregator).

        Returns
        -------
        Budget
            The effective budget afterwards; if it differs from ``budget``, the ledger
            kept its own (lower) value.
        """
        if not isinstance(budget, Budget):
            raise ConfigError(f"budget must be a Budget(epsilon, delta), got {budget!r}")
        current = self.budget
        if budget.epsilon >= current.epsilon and budget.delta >= current.delta:
            return current  # nothing to lower: no write transaction at all
        with self._write() as conn:
            current = rows.read_budget(conn)
            lowered = Budget(min(current.epsilon, budget.epsilon), min(current.delta, budget.delta))
            rows.lower_budget_rows(conn, current, lowered)
        return lowered

    # -- internals -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"privacy ledger {self.path} is closed; open it again")
        return self._conn

    @contextmanager
    def _transaction(self, begin: str, on_error: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                conn.execute(begin)
                try:
                    yield conn
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"privacy ledger {self.path}: {exc}{on_error}") from exc

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._transaction("BEGIN", "")

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        # IMMEDIATE takes the write lock before reading, so the budget check and the
        # insert see the same ledger even with several processes on one file.
        return self._transaction("BEGIN IMMEDIATE", "; nothing was written")

    def _snapshot(self) -> Snapshot:
        with self._read() as conn:
            return Snapshot(rows.read_budget(conn), rows.read_entries(conn, self.path))
