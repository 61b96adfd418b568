"""The ε a site has computed, kept between its processes, each value authenticated with its ledger key.

Accounting a round (PRV, the default accountant) takes about a second per composition on a
busy core, and a round's message composes several: the spend with the round reserved, then
the projection of the rounds left (:func:`~fedshard.privacy.ledger.spend.project`). A
deployed site answers every message in a fresh process, so without a memory it composes
them all again each round, where most were composed by the message before (the reservation
is the last projection's first candidate, the next projection its neighbours).

So a site keeps what its process composed in ``privacy-epsilon.json`` in its state folder:
ε by composition (merged events, δ, accountant), each entry with a MAC under the site's
ledger key (:class:`~fedshard.privacy.ledger.chain.LedgerKey`). An entry whose MAC does not
verify is ignored and composed again: a folder edited to lower an ε cannot lower what the
ledger charges. The file is a cache (written atomically, not synced): lost, it is rebuilt.
It holds at most :data:`KEPT` entries, the newest.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from pathlib import Path
from typing import Any

from fedshard.privacy.accountant import Composition, accounted, compositions, remember
from fedshard.privacy.ledger.chain import LedgerKey

__all__ = ["EPSILON_FILE", "KEPT", "EpsilonMemo"]

log = logging.getLogger(__name__)

EPSILON_FILE = "privacy-epsilon.json"
KEPT = 256
"""Entries the file keeps (the newest): a site's next messages compose near its last ones."""
_KIND = "epsilon-memo"


def _text(composition: Composition) -> str:
    """The composition as canonical text (floats as ``repr``: exact)."""
    merged, delta, accountant = composition
    return json.dumps([[[repr(s), repr(q), n] for s, q, n in merged], repr(delta), accountant])


def _composition(text: str) -> Composition:
    """The composition :func:`_text` wrote (ValueError, TypeError or KeyError for anything else)."""
    merged, delta, accountant = json.loads(text)
    events = tuple((float(s), float(q), int(n)) for s, q, n in merged)
    return events, float(delta), str(accountant)


class EpsilonMemo:
    """One site's authenticated memory of composed ε (see the module docstring).

    Parameters
    ----------
    state_dir:
        The site's state folder (the file lives there).
    key:
        The site's ledger key: it authenticates every entry.
    """

    def __init__(self, state_dir: Path, key: LedgerKey) -> None:
        self.path = state_dir / EPSILON_FILE
        self.key = key
        self._loaded = False
        self._mark = 0  # accounted() when the message began

    def _mac(self, text: str, value: str) -> str:
        return self.key.mac(b"", _KIND, [text, value]).hex()

    def load(self) -> None:
        """A message begins: give this process the file's authenticated entries (once per
        process; a missing or unreadable file gives none, an entry that fails its MAC is skipped)."""
        self._mark = accounted()
        if self._loaded:
            return
        self._loaded = True
        try:
            doc = json.loads(self.path.read_text())
            entries = doc["entries"] if isinstance(doc, dict) else []
        except (OSError, ValueError, KeyError, TypeError):
            return
        known: dict[Composition, float] = {}
        skipped = 0
        for entry in entries if isinstance(entries, list) else []:
            try:
                text, value, mac = entry
                if not hmac.compare_digest(self._mac(text, value), mac):
                    raise ValueError("MAC")
                known[_composition(text)] = float(value)
            except (ValueError, TypeError, KeyError):
                skipped += 1
        if skipped:
            log.warning("%s: %d entries failed their check and are composed again", self.path, skipped)
        remember(known)

    def save(self) -> None:
        """The message is done: if it ran the accountant, write the newest :data:`KEPT` ε this
        process knows; atomically (a crash leaves the old file or the new one)."""
        if accounted() == self._mark:  # all from memory (another site of this process composed them)
            return
        self._mark = accounted()
        # the process's memory holds what the file gave it (remember) and what it composed since
        entries = [(_text(c), repr(v)) for c, v in compositions(KEPT).items()]
        doc: dict[str, Any] = {"format": 1, "entries": [[t, v, self._mac(t, v)] for t, v in entries]}
        tmp = self.path.with_name(f".{self.path.name}.new")
        try:
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
            os.replace(tmp, self.path)
        except OSError as exc:  # a cache: the site goes on, composing again next time
            log.warning("cannot keep composed ε in %s: %s", self.path, exc.strerror or exc)
