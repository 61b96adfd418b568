"""Reading and writing the ledger's rows inside a transaction the caller holds.

Each function takes an open :class:`sqlite3.Connection` in a transaction (see
:class:`~fedshard.privacy.ledger.PrivacyLedger`); the schema and its triggers are in
:mod:`fedshard.privacy.ledger._schema`, the MAC chain in :mod:`fedshard.privacy.ledger.chain`.
:func:`load` reads every row and checks the whole chain; the writers append rows that
extend the :class:`Chain` they are given.
"""

from __future__ import annotations

import hmac
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshard.errors import PrivacyError, StoreError
from fedshard.privacy.events import MECHANISM, DPEvent, Guarantee
from fedshard.privacy.ledger._schema import DO_NOT_DELETE, META_KEYS
from fedshard.privacy.ledger.chain import MAC_BYTES, Field, LedgerKey
from fedshard.privacy.ledger.records import Budget, LedgerEntry, LedgerHead

__all__ = ["Chain", "genesis_values", "insert_budget", "insert_commits", "insert_events", "load", "tampered"]

# Column kinds of each chained row, in MAC order: i INTEGER, f REAL, s TEXT.
_KINDS = {"budget": "ifff", "event": "iiissffifff", "commit": "iif"}
_SELECTS = {
    "budget": "SELECT pos, epsilon, delta, set_at, mac FROM budgets",
    "event": "SELECT pos, seq, round, mechanism, guarantee, noise_multiplier, sample_rate, steps, delta,"
    " epsilon_after, created_at, mac FROM events",
    "commit": "SELECT pos, seq, committed_at, mac FROM commits",
}
_META_KINDS = "issfss"  # in META_KEYS order


def tampered(path: Path, problem: str) -> StoreError:
    """The one-line error for a ledger whose rows or history fail authentication."""
    return StoreError(
        f"privacy ledger {path} {problem}: the site releases nothing until it is restored from a backup, or "
        f"`fedshard budget recover` starts a ledger that carries the anchored ε forward; {DO_NOT_DELETE}"
    )


@dataclass
class Chain:
    """Every row of a ledger as one transaction read it, checked against its MAC chain.

    ``macs[n]`` is the MAC of chain row ``n`` (``macs[0]`` the ledger's identity), so the
    ledger's :attr:`head` is its last one.
    """

    meta: dict[str, Any]
    budget: Budget | None
    entries: tuple[LedgerEntry, ...]
    macs: list[bytes] = field(default_factory=list)
    next_seq: int = 1

    @property
    def ledger_id(self) -> str:
        """The ledger's random id."""
        return str(self.meta["ledger_id"])

    @property
    def head(self) -> LedgerHead:
        """Where the chain ends."""
        return LedgerHead(self.ledger_id, len(self.macs) - 1, self.macs[-1].hex())

    def append(self, key: LedgerKey, kind: str, values: Sequence[Field]) -> tuple[int, bytes]:
        """The position and MAC of a new row ``values`` (position first) of ``kind``; extends the chain."""
        mac = key.mac(self.macs[-1], kind, values)
        self.macs.append(mac)
        return len(self.macs) - 1, mac


def _typed(values: Sequence[Any], kinds: str) -> tuple[Field, ...] | None:
    """``values`` as the chain encodes them, or None if one has the wrong type (a damaged row)."""
    out: list[Field] = []
    for value, kind in zip(values, kinds, strict=True):
        if kind == "i" and isinstance(value, int) and not isinstance(value, bool):
            out.append(value)
        elif kind == "f" and isinstance(value, int | float) and not isinstance(value, bool):
            out.append(float(value))
        elif kind == "s" and isinstance(value, str):
            out.append(value)
        else:
            return None
    return tuple(out)


def genesis_values(meta: Mapping[str, Any]) -> tuple[Field, ...] | None:
    """The meta values the genesis MAC covers, in :data:`META_KEYS` order, or None if damaged."""
    return _typed([meta.get(k) for k in META_KEYS], _META_KINDS)


def load(conn: sqlite3.Connection, path: Path, key: LedgerKey) -> Chain:
    """Read every row and check the whole MAC chain under ``key``.

    Raises
    ------
    StoreError
        If the ledger was written under another key (or none), or a row was edited,
        inserted, removed or moved (one line naming the row), or holds an event this
        fedshard cannot read.
    """
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    stored_key = meta.get("key_id")
    if stored_key != key.key_id:
        if not key.keyed:
            raise StoreError(
                f"privacy ledger {path} is authenticated under key {stored_key}; open it with the site's key "
                "(its store.kek)"
            )
        if not stored_key:
            raise tampered(path, "is not authenticated (it was written without the site's key)")
        raise tampered(path, f"is authenticated under key {stored_key}, not this site's key {key.key_id}")
    identity = genesis_values(meta)
    if identity is None:
        raise tampered(path, "has damaged meta rows")
    rows: list[tuple[str, tuple[Field, ...], Any]] = []
    for kind, select in _SELECTS.items():
        for *values, mac in conn.execute(select):
            typed = _typed(values, _KINDS[kind])
            if typed is None:
                raise tampered(path, f"has a damaged {kind} row (a value of the wrong type)")
            rows.append((kind, typed, mac))
    rows.sort(key=lambda row: row[1][0])
    chain = Chain(meta, None, ())
    chain.macs.append(key.genesis(identity))
    events: dict[int, tuple[Field, ...]] = {}
    committed: set[int] = set()
    budgets: list[tuple[float, float]] = []
    for kind, values, mac in rows:
        if values[0] != len(chain.macs):
            raise tampered(path, f"is missing chain row {len(chain.macs)} (rows were removed or inserted)")
        expected = key.mac(chain.macs[-1], kind, values)
        if not (isinstance(mac, bytes) and len(mac) == MAC_BYTES and hmac.compare_digest(mac, expected)):
            raise tampered(path, f"was edited: chain row {values[0]} ({kind}) does not match its MAC")
        chain.macs.append(expected)
        if kind == "budget":
            budgets.append((float(values[1]), float(values[2])))
        elif kind == "event":
            events[int(values[1])] = values
        elif int(values[1]) in events:
            committed.add(int(values[1]))
        else:
            raise tampered(path, f"commits event {values[1]} before it was reserved")
    if not budgets:
        raise tampered(path, "records no budget")
    try:
        chain.budget = Budget(min(b[0] for b in budgets), min(b[1] for b in budgets))
    except Exception as exc:  # a budget row out of range: only an edit writes one
        raise tampered(path, f"holds a budget this fedshard refuses ({exc})") from None
    chain.entries = tuple(_entry(path, values, seq in committed) for seq, values in sorted(events.items()))
    chain.next_seq = max(events, default=0) + 1
    return chain


def _entry(path: Path, values: tuple[Field, ...], committed: bool) -> LedgerEntry:
    _, seq, rnd, mechanism, guarantee, sigma, q, steps, delta, eps, created = values
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
    return LedgerEntry(int(seq), int(rnd), event, float(eps), float(delta), committed, float(created))


def insert_events(
    conn: sqlite3.Connection,
    chain: Chain,
    key: LedgerKey,
    round: int,
    events: Sequence[DPEvent],
    delta: float,
    epsilon_after: Mapping[Guarantee, float],
    now: float,
) -> tuple[int, ...]:
    """Append ``events`` of ``round`` (each with the ε after it); return their sequence numbers.

    ``chain`` grows by the rows and its entries by the events, so what is anchored from it
    after the write (the ledger's ``on_grow``) includes their spend."""
    seqs = []
    added: list[LedgerEntry] = []
    for event in events:
        seq = chain.next_seq
        chain.next_seq += 1
        values: tuple[Field, ...] = (
            seq,
            round,
            MECHANISM,
            event.guarantee.value,
            float(event.noise_multiplier),
            float(event.sample_rate),
            int(event.steps),
            float(delta),
            float(epsilon_after[event.guarantee]),
            float(now),
        )
        pos, mac = chain.append(key, "event", (len(chain.macs), *values))
        conn.execute(
            "INSERT INTO events (seq, round, mechanism, guarantee, noise_multiplier, sample_rate, steps,"
            " delta, epsilon_after, created_at, pos, mac) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*values, pos, mac),
        )
        seqs.append(seq)
        added.append(LedgerEntry(seq, round, event, float(epsilon_after[event.guarantee]), float(delta), False, now))
    chain.entries = (*chain.entries, *added)
    return tuple(seqs)


def insert_commits(conn: sqlite3.Connection, chain: Chain, key: LedgerKey, seqs: Sequence[int], now: float) -> None:
    """Mark events ``seqs`` committed at ``now``; an event already committed keeps its first commit."""
    done = {entry.seq for entry in chain.entries if entry.committed}
    for seq in seqs:
        if seq in done:
            continue
        done.add(seq)
        pos, mac = chain.append(key, "commit", (len(chain.macs), int(seq), float(now)))
        conn.execute("INSERT INTO commits (seq, committed_at, pos, mac) VALUES (?, ?, ?, ?)", (seq, now, pos, mac))


def insert_budget(conn: sqlite3.Connection, chain: Chain, key: LedgerKey, budget: Budget, now: float) -> None:
    """Record ``budget`` (no higher than the effective one: a trigger refuses any rise)."""
    pos, mac = chain.append(key, "budget", (len(chain.macs), budget.epsilon, budget.delta, float(now)))
    conn.execute(
        "INSERT INTO budgets (pos, epsilon, delta, set_at, mac) VALUES (?, ?, ?, ?, ?)",
        (pos, budget.epsilon, budget.delta, now, mac),
    )
    old = chain.budget
    chain.budget = budget if old is None else Budget(min(old.epsilon, budget.epsilon), min(old.delta, budget.delta))
