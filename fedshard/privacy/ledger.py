"""The per-site privacy ledger: every DP event a site released, in an SQLite file on its side.

A site *reserves* the events of a round before anything leaves it, and *commits* the
reservation once the round's update has been sent. The ledger refuses a reservation
that would take the site's ε past its budget (:class:`~fedshard.errors.BudgetExhaustedError`,
nothing is written and nothing may be released).

Conservative, never optimistic
------------------------------
* ε spent counts **every** reserved event, committed or not: a reservation whose
  commit was lost (crash, network error) may have been released, so it is spent.
* ε spent is never less than an ε the ledger has already recorded (``epsilon_after``),
  so an Opacus upgrade or opening the ledger with another accountant cannot shrink it.
* The effective budget is the lowest ever given, for ε and δ separately.

Threat model
------------
The ledger lives at the site and is the site's own record. The aggregator may send a
budget with a round; it is applied through :meth:`PrivacyLedger.lower_budget`, so the
aggregator can **lower** a site's budget, **never raise** it. Whoever can write the file
can of course rewrite it; the ledger defends against bugs and crashes, not against the
site's own administrator.

Storage and the stability contract
----------------------------------
One SQLite file (WAL journal, ``synchronous=FULL``, every write one transaction, so a
crash leaves either the whole write or none of it). Tables:

* ``meta``: format version, created_at, the accountant it was created with, and the
  effective budget. The budget rows are the only ones ever updated, and a trigger lets
  them only go down.
* ``events``: append-only; one row per DP event with its round, δ and the ε after it.
* ``commits``: append-only; one row per committed event.

Triggers refuse updates and deletes of ``events`` and ``commits``: a stored event never
changes meaning (see :mod:`fedshard.privacy.events`). A new file is built under a
temporary name and linked into place, so a ledger path that exists is always a complete
ledger; opening never modifies an existing ledger. A file that fails ``PRAGMA
quick_check``, is not a ledger or has a newer format is refused with
:class:`~fedshard.errors.StoreError` and left untouched.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from fedshard.errors import BudgetExhaustedError, ConfigError, PrivacyError, StoreError
from fedshard.privacy.accountant import AccountantKind, epsilon
from fedshard.privacy.events import MECHANISM, DPEvent, Guarantee
from fedshard.privacy.ledger_file import DO_NOT_DELETE, FORMAT_VERSION, create, open_checked

__all__ = [
    "FORMAT_VERSION",
    "MAX_PROJECTED_ROUNDS",
    "Budget",
    "LedgerEntry",
    "LedgerStatus",
    "PrivacyLedger",
    "Reservation",
]

MAX_PROJECTED_ROUNDS = 10_000
""":attr:`LedgerStatus.projected_rounds_left` stops counting here."""

_SELECT_ENTRIES = """
SELECT e.seq, e.round, e.mechanism, e.guarantee, e.noise_multiplier, e.sample_rate, e.steps,
       e.delta, e.epsilon_after, e.created_at, c.seq IS NOT NULL
FROM events AS e LEFT JOIN commits AS c ON c.seq = e.seq
ORDER BY e.seq
"""


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
class LedgerEntry:
    """One stored event, as :meth:`PrivacyLedger.entries` reports it."""

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
        How many more such rounds fit (at most :data:`MAX_PROJECTED_ROUNDS`);
        ``None`` when no next round was described.
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


@dataclass(frozen=True, slots=True)
class _Snapshot:
    budget: Budget
    entries: tuple[LedgerEntry, ...]


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
            return _read_budget(conn)

    def entries(self) -> list[LedgerEntry]:
        """Every stored event, oldest first, with its commit state.

        Returns
        -------
        list of LedgerEntry
        """
        with self._read() as conn:
            return list(self._entries(conn))

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
        snapshot = self._snapshot()
        return self._spent(snapshot, Guarantee(guarantee))

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
        return self._cost(self._snapshot(), _check_events(events))

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
        spent = {g: self._spent(snapshot, g) for g in Guarantee}
        remaining = {g: max(0.0, snapshot.budget.epsilon - eps) for g, eps in spent.items()}
        pending = sorted({entry.round for entry in snapshot.entries if not entry.committed})
        projected: int | None = None
        can_afford = True
        if next_round:
            projected = self._project(snapshot, _check_events(next_round))
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
        new = _check_events(events)
        if not new:
            raise PrivacyError(f"round {round}: a reservation needs at least one DP event")
        with self._write() as conn:
            snapshot = _Snapshot(_read_budget(conn), self._entries(conn))
            if any(entry.round == round for entry in snapshot.entries):
                raise PrivacyError(f"round {round} already has a reservation; a round is charged once")
            after = self._cost(snapshot, new)
            for guarantee, eps in after.items():
                if eps > snapshot.budget.epsilon:
                    raise BudgetExhaustedError(
                        f"round {round} would take {guarantee.value}-level ε to {eps:.6g}, over the budget "
                        f"{snapshot.budget.epsilon:.6g} (δ={snapshot.budget.delta:g}); nothing was released"
                    )
            now = self._clock()
            seqs = []
            for event in new:
                cursor = conn.execute(
                    "INSERT INTO events (round, mechanism, guarantee, noise_multiplier, sample_rate, steps,"
                    " delta, epsilon_after, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        round,
                        MECHANISM,
                        event.guarantee.value,
                        event.noise_multiplier,
                        event.sample_rate,
                        event.steps,
                        snapshot.budget.delta,
                        after[event.guarantee],
                        now,
                    ),
                )
                seqs.append(int(cursor.lastrowid or 0))
        return Reservation(round=round, seqs=tuple(seqs), epsilon_after=after)

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
            marks = ", ".join("?" * len(seqs))
            rows = conn.execute(f"SELECT seq, round FROM events WHERE seq IN ({marks})", seqs).fetchall()
            if not seqs or len(rows) != len(seqs) or any(r != reservation.round for _, r in rows):
                raise PrivacyError(f"{self.path} holds no reservation of round {reservation.round} with events {seqs}")
            now = self._clock()
            conn.executemany(
                "INSERT OR IGNORE INTO commits (seq, committed_at) VALUES (?, ?)", [(seq, now) for seq in seqs]
            )

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
            current = _read_budget(conn)
            lowered = Budget(min(current.epsilon, budget.epsilon), min(current.delta, budget.delta))
            for key, old, new in (
                ("budget_epsilon", current.epsilon, lowered.epsilon),
                ("budget_delta", current.delta, lowered.delta),
            ):
                if new < old:
                    conn.execute("UPDATE meta SET value = ? WHERE key = ?", (new, key))
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

    def _snapshot(self) -> _Snapshot:
        with self._read() as conn:
            return _Snapshot(_read_budget(conn), self._entries(conn))

    def _entries(self, conn: sqlite3.Connection) -> tuple[LedgerEntry, ...]:
        entries = []
        for seq, rnd, mechanism, guarantee, sigma, q, steps, delta, eps, created, committed in conn.execute(
            _SELECT_ENTRIES
        ):
            try:
                event = DPEvent.from_dict(
                    {
                        "mechanism": mechanism,
                        "guarantee": guarantee,
                        "noise_multiplier": sigma,
                        "sample_rate": q,
                        "steps": steps,
                    }
                )
            except PrivacyError as exc:
                raise StoreError(
                    f"privacy ledger {self.path} holds event {seq} this fedshard cannot read ({exc}); {DO_NOT_DELETE}"
                ) from exc
            entries.append(LedgerEntry(seq, rnd, event, float(eps), float(delta), bool(committed), float(created)))
        return tuple(entries)

    def _epsilon_of(self, snapshot: _Snapshot, guarantee: Guarantee, extra: Sequence[DPEvent]) -> float:
        mine = [entry for entry in snapshot.entries if entry.event.guarantee is guarantee]
        recorded = max((entry.epsilon_after for entry in mine), default=0.0)
        events = [entry.event for entry in mine] + [event for event in extra if event.guarantee is guarantee]
        return max(recorded, epsilon(events, snapshot.budget.delta, self.accountant))

    def _spent(self, snapshot: _Snapshot, guarantee: Guarantee) -> float:
        return self._epsilon_of(snapshot, guarantee, ())

    def _cost(self, snapshot: _Snapshot, events: Sequence[DPEvent]) -> dict[Guarantee, float]:
        involved = sorted({event.guarantee for event in events})
        return {g: self._epsilon_of(snapshot, g, events) for g in involved}

    def _project(self, snapshot: _Snapshot, next_round: Sequence[DPEvent]) -> int:
        """Largest k <= MAX_PROJECTED_ROUNDS such that k more rounds fit (ε grows with k)."""

        def fits(k: int) -> bool:
            # k rounds of the same events compose like one round with k times the steps.
            scaled = [replace(event, steps=event.steps * k) for event in next_round]
            return all(eps <= snapshot.budget.epsilon for eps in self._cost(snapshot, scaled).values())

        if not fits(1):
            return 0
        low, high = 1, 2
        while high <= MAX_PROJECTED_ROUNDS and fits(high):
            low, high = high, high * 2
        if high > MAX_PROJECTED_ROUNDS:
            if fits(MAX_PROJECTED_ROUNDS):
                return MAX_PROJECTED_ROUNDS
            high = MAX_PROJECTED_ROUNDS
        while high - low > 1:  # invariant: fits(low), not fits(high)
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low


def _check_events(events: Sequence[DPEvent]) -> tuple[DPEvent, ...]:
    checked = tuple(events)
    for event in checked:
        if not isinstance(event, DPEvent):
            raise PrivacyError(f"expected DPEvent, got {event!r}")
    return checked


def _read_budget(conn: sqlite3.Connection) -> Budget:
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('budget_epsilon', 'budget_delta')"))
    return Budget(meta["budget_epsilon"], meta["budget_delta"])
