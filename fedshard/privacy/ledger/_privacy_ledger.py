"""The :class:`PrivacyLedger`: reserve a round's DP events before release, commit them after.

The reading side (:meth:`PrivacyLedger.status`, :meth:`~PrivacyLedger.spent`,
:meth:`~PrivacyLedger.cost`, :meth:`~PrivacyLedger.entries`) and the writing side
(:meth:`~PrivacyLedger.reserve`, :meth:`~PrivacyLedger.commit`,
:meth:`~PrivacyLedger.lower_budget`) each run in one SQLite transaction; the arithmetic is
in :mod:`~fedshard.privacy.ledger.spend`, the rows in :mod:`~fedshard.privacy.ledger._rows`
and the file in :mod:`~fedshard.privacy.ledger._schema`. The guarantees are described in
:mod:`fedshard.privacy.ledger`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType

from fedshard._fs import deferring
from fedshard.errors import BudgetExhaustedError, ConfigError, PrivacyError, StoreError
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import _rows as rows
from fedshard.privacy.ledger import spend
from fedshard.privacy.ledger._schema import FORMAT_VERSION, create, open_checked
from fedshard.privacy.ledger.chain import UNKEYED, LedgerKey
from fedshard.privacy.ledger.records import CARRIED_ROUND, Budget, LedgerEntry, LedgerHead, LedgerStatus, Reservation
from fedshard.privacy.ledger.spend import Snapshot, check_events

OnGrow = Callable[[LedgerHead, Snapshot], None]
"""Called after every write the ledger made durable, with its new head (to anchor it)."""

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
    key:
        The key that authenticates every row (see :mod:`~fedshard.privacy.ledger.chain`);
        None: :data:`~fedshard.privacy.ledger.chain.UNKEYED`, for bare library use.
    on_grow:
        Called with the new head after each write that changes what the ledger has spent
        or allows (a new ledger, a reservation, a lower budget) is durable, and before the
        call returns (the site anchors the head outside the file there); if it raises, the
        write stays (a reservation stays spent) and the error propagates. A commit row
        changes neither (a reservation counts as spent, committed or not), so it is not
        anchored: the anchor may lag the ledger's head by commit rows.

    Raises
    ------
    StoreError
        If the file is corrupt, not a ledger, of another format, unreadable, written
        under another key, or its rows fail their MAC chain; the file is left as it was.
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
        key: LedgerKey | None = None,
        on_grow: OnGrow | None = None,
    ) -> None:
        if budget is not None and not isinstance(budget, Budget):
            raise ConfigError(f"budget must be a Budget(epsilon, delta), got {budget!r}")
        self.path = Path(path)
        self._clock = clock
        self._key = key if key is not None else UNKEYED
        self._on_grow = on_grow
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._checked: tuple[tuple[int, int], rows.Chain] | None = None  # the last chain checked, and when
        if not self.path.exists():
            if budget is None:
                raise StoreError(f"no privacy ledger at {self.path}: the site has not taken part in a DP round yet")
            self._create(budget, AccountantKind(accountant or AccountantKind.PRV), (), None)
        self._conn = open_checked(self.path)
        try:
            with self._read() as conn:
                chain = self._load(conn)
            self.ledger_id = chain.ledger_id
            self.accountant = AccountantKind(accountant or chain.meta["accountant"])
            found = chain.meta.get("recovered_from") or ""
            # the head of the ledger this one replaced (see recover), if any
            self.recovered_from = LedgerHead.from_dict(json.loads(found)) if found else None
            if budget is not None:
                self.lower_budget(budget)
        except BaseException:
            self.close()
            raise

    @classmethod
    def recover(
        cls,
        path: str | os.PathLike[str],
        budget: Budget,
        carried: Sequence[tuple[DPEvent, float]],
        replaces: LedgerHead,
        *,
        key: LedgerKey | None = None,
        accountant: AccountantKind | None = None,
        clock: Callable[[], float] = time.time,
        on_grow: OnGrow | None = None,
    ) -> PrivacyLedger:
        """Start a new ledger at ``path`` whose first events carry ``carried`` forward.

        Each carried ``(event, ε after)`` is stored committed, with round
        :data:`~fedshard.privacy.ledger.CARRIED_ROUND`, so ε spent never goes below what
        the replaced ledger (whose head was ``replaces``) had spent.

        Raises
        ------
        StoreError
            If a file is already at ``path`` (move it aside first).
        """
        target = Path(path)
        if target.exists():
            raise StoreError(f"privacy ledger {target} exists: move it aside before recovering")
        ledger = cls.__new__(cls)
        ledger.path, ledger._clock, ledger._key = target, clock, key if key is not None else UNKEYED
        ledger._create(budget, AccountantKind(accountant or AccountantKind.PRV), _checked_carried(carried), replaces)
        return cls(target, None, accountant=accountant, clock=clock, key=key, on_grow=on_grow)

    def _create(
        self,
        budget: Budget,
        accountant: AccountantKind,
        carried: Sequence[tuple[DPEvent, float]],
        replaces: LedgerHead | None,
    ) -> None:
        now = self._clock()
        meta: dict[str, int | float | str] = {
            "ledger_id": uuid.uuid4().hex,
            "key_id": self._key.key_id,
            "created_at": float(now),
            "accountant": accountant.value,
            "recovered_from": json.dumps(replaces.to_dict(), sort_keys=True) if replaces is not None else "",
        }

        def fill(conn: sqlite3.Connection) -> None:
            chain = rows.Chain(dict(meta, format=FORMAT_VERSION), None, ())
            identity = rows.genesis_values(chain.meta)
            assert identity is not None
            chain.macs.append(self._key.genesis(identity))
            rows.insert_budget(conn, chain, self._key, budget, now)
            for event, eps in carried:
                after = {event.guarantee: eps}
                seqs = rows.insert_events(conn, chain, self._key, CARRIED_ROUND, [event], budget.delta, after, now)
                rows.insert_commits(conn, chain, self._key, seqs, now)

        create(self.path, meta, fill)

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
        return self._snapshot().budget

    def entries(self) -> list[LedgerEntry]:
        """Every stored event, oldest first, with its commit state.

        Returns
        -------
        list of LedgerEntry
        """
        return list(self._snapshot().entries)

    def head(self) -> LedgerHead:
        """Where the ledger's MAC chain ends now (what the site anchors outside the file)."""
        with self._read() as conn:
            return self._load(conn).head

    def contains(self, head: LedgerHead) -> bool:
        """Whether ``head`` is a point of this ledger's history (or of the one it replaced).

        A head of this ledger must name one of its chain rows with that row's MAC. A head
        of the ledger this one was recovered from (:attr:`recovered_from`) must not be
        past what was carried forward.
        """
        with self._read() as conn:
            chain = self._load(conn)
        if head.ledger_id == chain.ledger_id:
            return head.length < len(chain.macs) and chain.macs[head.length].hex() == head.mac
        old = self.recovered_from
        if old is None or head.ledger_id != old.ledger_id:
            return False
        return head.length < old.length or head == old

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

    def status(self, next_round: Sequence[DPEvent] = (), hint: int | None = None) -> LedgerStatus:
        """Budget, spend and what is left, optionally for rounds costing ``next_round``.

        Parameters
        ----------
        next_round:
            The events one more round would add; empty to skip the projection.
        hint:
            Where the search for the rounds left starts (e.g. the last projection, one
            round on); it changes how long the search takes, never its answer.

        Returns
        -------
        LedgerStatus
        """
        snapshot = self._snapshot()
        spent = {g: spend.epsilon_of(snapshot, g, (), self.accountant) for g in Guarantee}
        remaining = {g: max(0.0, snapshot.budget.epsilon - eps) for g, eps in spent.items()}
        pending = sorted({entry.round for entry in snapshot.entries if not entry.committed})
        rounds = {entry.round for entry in snapshot.entries if entry.round != CARRIED_ROUND}
        projected: int | None = None
        can_afford = True
        if next_round:
            projected = spend.project(snapshot, check_events(next_round), self.accountant, hint)
            can_afford = projected >= 1
        return LedgerStatus(
            budget=snapshot.budget,
            accountant=self.accountant,
            spent=spent,
            remaining=remaining,
            rounds_participated=len(rounds),
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
            chain = self._load(conn)
            snapshot = _snapshot_of(chain)
            if any(entry.round == round for entry in snapshot.entries):
                raise PrivacyError(f"round {round} already has a reservation; a round is charged once")
            after = spend.cost(snapshot, new, self.accountant)
            for guarantee, eps in after.items():
                if eps > snapshot.budget.epsilon:
                    raise BudgetExhaustedError(
                        f"round {round} would take {guarantee.value}-level ε to {eps:.6g}, over the budget "
                        f"{snapshot.budget.epsilon:.6g} (δ={snapshot.budget.delta:g}); nothing was released"
                    )
            seqs = rows.insert_events(conn, chain, self._key, round, new, snapshot.budget.delta, after, self._clock())
        self._grown(chain)
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
        # Not made durable at once (SQLite's synchronous=NORMAL in WAL mode: consistent, synced
        # with the next durable write): a commit row lost in a crash leaves the reservation,
        # which counts as spent anyway; and not anchored (see ``on_grow``).
        with self._write(durable=False) as conn:
            chain = self._load(conn)
            stored = {entry.seq: entry.round for entry in chain.entries if entry.seq in set(seqs)}
            if not seqs or len(stored) != len(seqs) or any(r != reservation.round for r in stored.values()):
                raise PrivacyError(f"{self.path} holds no reservation of round {reservation.round} with events {seqs}")
            rows.insert_commits(conn, chain, self._key, seqs, self._clock())

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
            chain = self._load(conn)
            now = _snapshot_of(chain).budget
            lowered = Budget(min(now.epsilon, budget.epsilon), min(now.delta, budget.delta))
            rows.insert_budget(conn, chain, self._key, lowered, self._clock())
        self._grown(chain)
        return lowered

    # -- internals -------------------------------------------------------------------

    def _load(self, conn: sqlite3.Connection) -> rows.Chain:
        """The ledger's rows, checked against the MAC chain: read and checked again only when the file
        changed since the last check (a commit by another connection, which SQLite's
        ``data_version`` counts, or a change by this one). A copy: writers extend it."""
        stamp = (conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes)
        if self._checked is None or self._checked[0] != stamp:
            self._checked = (stamp, rows.load(conn, self.path, self._key))
        chain = self._checked[1]
        return dataclasses.replace(chain, meta=dict(chain.meta), macs=list(chain.macs))

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

    @contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock before reading, so the budget check and the
        # insert see the same ledger even with several processes on one file.
        with self._lock:
            # under a barrier (fedshard._fs.Barrier) the caller makes the write durable with its sync
            durable = durable and not deferring(self.path)
            if not durable:
                self._connection().execute("PRAGMA synchronous=NORMAL")
            try:
                with self._transaction("BEGIN IMMEDIATE", "; nothing was written") as conn:
                    yield conn
            finally:
                if not durable and self._conn is not None:
                    self._conn.execute("PRAGMA synchronous=FULL")

    def _snapshot(self) -> Snapshot:
        with self._read() as conn:
            return _snapshot_of(self._load(conn))

    def _grown(self, chain: rows.Chain) -> None:
        if self._on_grow is not None:
            self._on_grow(chain.head, _snapshot_of(chain))


def _snapshot_of(chain: rows.Chain) -> Snapshot:
    assert chain.budget is not None  # load refuses a ledger without a budget
    return Snapshot(chain.budget, chain.entries)


def _checked_carried(carried: Sequence[tuple[DPEvent, float]]) -> tuple[tuple[DPEvent, float], ...]:
    checked = tuple((event, float(eps)) for event, eps in carried)
    check_events([event for event, _ in checked])
    return checked
