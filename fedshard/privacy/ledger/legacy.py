"""Reading a format-1 ledger (before rows were authenticated), to carry its spend forward.

Format 1 had no MACs: what it says is taken on trust, once, when the site's
administrator runs ``fedshard budget recover`` on it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from fedshard.errors import PrivacyError, StoreError
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import DPEvent
from fedshard.privacy.ledger.records import Budget, LedgerHead

__all__ = ["Format1", "read_format1"]

Format1 = tuple[Budget, AccountantKind, list[tuple[DPEvent, float]], LedgerHead]


def read_format1(path: Path) -> Format1 | None:
    """Budget, accountant, ``(event, ε after)`` per event, and a head naming the old file,
    if ``path`` is a format-1 ledger; None otherwise.

    Raises
    ------
    StoreError
        If it is a format-1 ledger whose rows cannot be read.
    """
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        if meta.get("format") != 1:
            return None
        rows = conn.execute(
            "SELECT mechanism, guarantee, noise_multiplier, sample_rate, steps, epsilon_after FROM events ORDER BY seq"
        ).fetchall()
        carried = [
            (
                DPEvent.from_dict(
                    {"mechanism": m, "guarantee": g, "noise_multiplier": s, "sample_rate": q, "steps": n}
                ),
                e,
            )
            for m, g, s, q, n, e in rows
        ]
        budget = Budget(meta["budget_epsilon"], meta["budget_delta"])
        return budget, AccountantKind(meta["accountant"]), carried, LedgerHead("format-1", len(rows), "")
    except sqlite3.Error:
        return None
    except (KeyError, ValueError, PrivacyError) as exc:
        raise StoreError(f"privacy ledger {path} (format 1) cannot be read ({exc}); restore it from a backup") from None
    finally:
        conn.close()
