"""What the coordinator remembers of every site's privacy ledger across the runs of one federation.

A site's ledger authenticates its rows and anchors its head in the site's sealed store,
so a ledger deleted or rolled back alone is caught by the site itself. A site whose
ledger *and* store are deleted together (or rolled back together to an earlier consistent
copy) has nothing left to compare with: it would start a fresh ledger and spend its
budget again. The aggregator host therefore keeps, per federation (``federation.name``),
each site's last reported ledger head and ε spent in a file that outlives a run
(``<deployment.state_dir>/ledger-heads.json``):

* every run sends each site the head the book holds, at discovery and with its first
  train instruction; a site whose ledger does not contain it refuses to release
  (:meth:`fedshard.site.privacy.SitePrivacy.open_ledger`), in one line;
* a site whose report shows less ε spent, under either guarantee, than the book records
  is refused by the coordinator (never selected), in one line, whatever its ledger says.

What remains possible: when the site's state *and* the aggregator host's book are both
wiped (or the site joins a federation under another name), nothing remembers the spend;
the site's operator must keep its state folder and its key bundle backed up.

The file's contract: a JSON object ``{"format": 1, "federations": {name: {site: {"ledger_id",
"length", "mac", "epsilon_record", "epsilon_update"}}}}``, written whole to a temporary
file and renamed (a crash leaves the old file or the new one). A recorded spend never
decreases.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshard.errors import ConfigError
from fedshard.protocol.messages import LedgerHeadReport, PrivacyReport

__all__ = ["LEDGER_BOOK_FILE", "LedgerBook"]

log = logging.getLogger(__name__)

LEDGER_BOOK_FILE = "ledger-heads.json"
"""The book's file, in the aggregator host's ``deployment.state_dir``."""
_FORMAT = 1
_TOLERANCE = 1e-9  # ε is a float the ledger recomputes: equal spends may differ in the last bits


@dataclass(frozen=True)
class _Known:
    head: LedgerHeadReport
    record: float
    update: float

    def to_json(self) -> dict[str, Any]:
        return {**self.head.model_dump(), "epsilon_record": self.record, "epsilon_update": self.update}


class LedgerBook:
    """Each site's last ledger head and spend in federation ``federation``, kept in ``path``.

    Raises
    ------
    ConfigError
        ``path`` exists but is not a ledger book (one line; nothing is overwritten).
    """

    def __init__(self, path: str | Path, federation: str) -> None:
        self.path = Path(path)
        self.federation = federation
        self._all = self._load()
        self._known = {site: _known(entry) for site, entry in self._all.get(federation, {}).items()}

    def _load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("format") != _FORMAT or not isinstance(doc.get("federations"), dict):
                raise ValueError("not a ledger book")
            for entries in doc["federations"].values():
                for entry in entries.values():
                    _known(entry)
            return dict(doc["federations"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(
                f"{self.path} is not a readable ledger book ({exc}); restore it from a backup (it records what "
                "every site has spent), or move it aside to start over without that record"
            ) from None

    def heads(self) -> dict[str, LedgerHeadReport]:
        """Site id → the last ledger head the book holds."""
        return {site: known.head for site, known in self._known.items()}

    def check(self, site_id: str, report: PrivacyReport | None) -> str | None:
        """Why ``site_id`` may not take part with ``report`` (its ledger has lost spend the
        book recorded), or None."""
        known = self._known.get(site_id)
        if known is None or report is None:
            return None
        for name, recorded, now in (
            ("record", known.record, report.epsilon_record),
            ("update", known.update, report.epsilon_update),
        ):
            if now < recorded - _TOLERANCE * max(1.0, recorded):
                return (
                    f"site {site_id} reports ε {now:.4g} spent at {name} level but this federation recorded "
                    f"ε {recorded:.4g} (its ledger was deleted or rolled back with its store): it takes part in "
                    f"nothing; restore its state folder from a backup, or run `fedshard budget recover` there"
                )
        return None

    def record(self, reports: Mapping[str, PrivacyReport | None]) -> None:
        """Keep the heads and spends in ``reports`` (a spend never goes down); write if anything changed."""
        changed = False
        for site_id, report in reports.items():
            if report is None or report.ledger_head is None:
                continue
            before = self._known.get(site_id)
            record = max(report.epsilon_record, before.record if before else 0.0)
            update = max(report.epsilon_update, before.update if before else 0.0)
            known = _Known(report.ledger_head, record, update)
            if known != before:
                self._known[site_id] = known
                changed = True
        if changed:
            self._save()

    def _save(self) -> None:
        self._all[self.federation] = {site: known.to_json() for site, known in sorted(self._known.items())}
        doc = {"format": _FORMAT, "federations": self._all}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _known(entry: Mapping[str, Any]) -> _Known:
    head = LedgerHeadReport(ledger_id=str(entry["ledger_id"]), length=int(entry["length"]), mac=str(entry["mac"]))
    return _Known(head, float(entry["epsilon_record"]), float(entry["epsilon_update"]))
