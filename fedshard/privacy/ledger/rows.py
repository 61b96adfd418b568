"""Reading and writing the ledger's rows inside a transaction the caller holds.

Each function takes an open :class:`sqlite3.Connection` in a transaction (see
:class:`~fedshard.privacy.ledger.PrivacyLedger`); the schema and its triggers are in
:mod:`fedshard.privacy.ledger.schema`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedshard.errors import PrivacyError, StoreError
from fedshard.privacy.events import MECHANISM, DPEvent, Guarantee
from fedshard.privacy.ledger.records import Budget, LedgerEntry
from fedshard.privacy.ledger.schema import DO_NOT_DELETE

__all__ = ["insert_commits", "insert_events", "lower_budget_rows", "read_budget", "read_entries", "round_of_events"]

_SELECT_ENTRIES = """
SELECT e.seq, e.round, e.mechanism, e.guarantee, e.noise_multiplier, e.sample_rate, e.steps,
       e.delta, e.epsilon_after, e.created_at, c.seq IS NOT NULL
FROM events AS e LEFT JOIN commits AS c ON c.seq = e.seq
ORDER BY e.seq
"""


def read_budget(conn: sqlite3.Connection) -> Budget:
    """The effective budget stored in ``meta``."""
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('budget_epsilon', 'budget_delta')"))
    return Budget(meta["budget_epsilon"], meta["budget_delta"])


def read_entries(conn: sqlite3.Connection, path: Path) -> tuple[LedgerEntry, ...]:
    """Every stored event, oldest first, with its commit state.

    Raises
    ------
    StoreError
        If an event is one this fedshard cannot read (``path`` names the ledger).
    """
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
                f"privacy ledger {path} holds event {seq} this fedshard cannot read ({exc}); {DO_NOT_DELETE}"
            ) from exc
        entries.append(LedgerEntry(seq, rnd, event, float(eps), float(delta), bool(committed), float(created)))
    return tuple(entries)


def insert_events(
    conn: sqlite3.Connection,
    round: int,
    events: Sequence[DPEvent],
    delta: float,
    epsilon_after: Mapping[Guarantee, float],
    now: float,
) -> tuple[int, ...]:
    """Append ``events`` of ``round`` (each with the ε after it); return their sequence numbers."""
    seqs = []
    for event in events:
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
                delta,
                epsilon_after[event.guarantee],
                now,
            ),
        )
        seqs.append(int(cursor.lastrowid or 0))
    return tuple(seqs)


def round_of_events(conn: sqlite3.Connection, seqs: Sequence[int]) -> dict[int, int]:
    """``{seq: round}`` of the stored events among ``seqs``."""
    marks = ", ".join("?" * len(seqs))
    return dict(conn.execute(f"SELECT seq, round FROM events WHERE seq IN ({marks})", list(seqs)).fetchall())


def insert_commits(conn: sqlite3.Connection, seqs: Sequence[int], now: float) -> None:
    """Mark events ``seqs`` committed at ``now``; an event already committed keeps its first commit."""
    conn.executemany("INSERT OR IGNORE INTO commits (seq, committed_at) VALUES (?, ?)", [(seq, now) for seq in seqs])


def lower_budget_rows(conn: sqlite3.Connection, current: Budget, lowered: Budget) -> None:
    """Write the budget values of ``lowered`` that are below ``current`` (a trigger refuses any rise)."""
    for key, old, new in (
        ("budget_epsilon", current.epsilon, lowered.epsilon),
        ("budget_delta", current.delta, lowered.delta),
    ):
        if new < old:
            conn.execute("UPDATE meta SET value = ? WHERE key = ?", (new, key))
