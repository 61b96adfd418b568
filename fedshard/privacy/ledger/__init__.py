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
aggregator can **lower** a site's budget, **never raise** it.

Whoever can write the site's state folder could once delete, roll back or edit the file
and release more than the budget allows. Now:

* every row (budget, event, commit) carries an HMAC-SHA-256 chained over the row before
  it (:mod:`~fedshard.privacy.ledger.chain`), under a key derived from a site secret
  kept out of the state folder (its store key); a row edited, inserted, removed from
  the middle or moved, or the file written under another key, fails on open and on
  every read, and nothing is reserved;
* the chain's head (:class:`LedgerHead`) is anchored by the site outside the file after
  each write, before anything is released (its sealed store's catalog, authenticated
  by the store key), and reported to the coordinator, which sends the last one back
  with the next round; a ledger that lacks either head (deleted, rolled back, replaced)
  is refused. See :mod:`fedshard.site.ledger_anchor`.

A ledger opened without a key (bare library use) is chained under a public key: it
catches accidents, not edits. Someone holding the site's store key can forge anything;
restoring the state folder *and* the sealed store to an earlier copy together is caught
only by the coordinator's head, i.e. within a run of the coordinator.

Modules
-------
``_privacy_ledger`` :class:`PrivacyLedger`: reserve / commit / lower the budget / recover; status and queries
``chain``           :class:`LedgerKey` and the MAC chain over the rows
``records``         the values it takes and returns (:class:`Budget`, :class:`Reservation`, …)
``spend``           ε spent, the cost of new events, rounds left: pure functions
``_rows``           reading and writing rows inside a transaction
``_schema``         the file: format version, tables and triggers, creation, checked opening
"""

from __future__ import annotations

from fedshard.privacy.ledger._privacy_ledger import PrivacyLedger
from fedshard.privacy.ledger._schema import FORMAT_VERSION
from fedshard.privacy.ledger.chain import UNKEYED, LedgerKey
from fedshard.privacy.ledger.records import CARRIED_ROUND, Budget, LedgerEntry, LedgerHead, LedgerStatus, Reservation
from fedshard.privacy.ledger.spend import MAX_PROJECTED_ROUNDS

__all__ = [
    "CARRIED_ROUND",
    "FORMAT_VERSION",
    "MAX_PROJECTED_ROUNDS",
    "Budget",
    "LedgerEntry",
    "LedgerHead",
    "LedgerKey",
    "LedgerStatus",
    "PrivacyLedger",
    "Reservation",
    "UNKEYED",
]
