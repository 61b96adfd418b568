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

Modules
-------
``privacy_ledger``  :class:`PrivacyLedger`: reserve / commit / lower the budget; status and queries
``records``         the values it takes and returns (:class:`Budget`, :class:`Reservation`, …)
``spend``           ε spent, the cost of new events, rounds left: pure functions
``rows``            reading and writing rows inside a transaction
``schema``          the file: format version, tables and triggers, creation, checked opening
"""

from __future__ import annotations

from fedshard.privacy.ledger.chain import UNKEYED, LedgerKey
from fedshard.privacy.ledger.privacy_ledger import PrivacyLedger
from fedshard.privacy.ledger.records import CARRIED_ROUND, Budget, LedgerEntry, LedgerHead, LedgerStatus, Reservation
from fedshard.privacy.ledger.schema import FORMAT_VERSION
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
