"""Where a site anchors its privacy ledger's head outside the ledger file.

The ledger's MAC chain (:mod:`fedshard.privacy.ledger.chain`) catches a row edited,
inserted or removed from the middle; it cannot catch the file deleted, or rolled back to
an earlier copy, since an earlier copy is a valid chain. So after each write, before
anything is released, the site records the ledger's head, what it has spent and the
events it composed (compacted) in a place the ledger file does not control:

* :class:`CatalogAnchor`: the site's sealed model store's catalog, which its store key
  authenticates (the default of every simulated and deployed site);
* :class:`FileAnchor`: a small file authenticated with the ledger key (sites whose
  store is not encrypted).

The ledger may be ahead of its anchor (a crash between a write and the anchor: nothing
was released yet), never behind it. The anchored events let ``fedshard budget recover``
start a new ledger that carries the spend forward.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fedshard._fs import fsync_dir, fsync_fd
from fedshard.errors import ConfigError, PrivacyError, StoreError
from fedshard.integrity.canonical import canonical_text
from fedshard.privacy.accountant import AccountantKind
from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.ledger import Budget, LedgerHead
from fedshard.privacy.ledger.chain import LedgerKey
from fedshard.privacy.ledger.spend import Snapshot

if TYPE_CHECKING:
    from fedshard.crypto.at_rest import Kek
    from fedshard.store.kept import KeptStore

__all__ = ["ANCHOR_META", "Anchor", "AnchorStore", "CatalogAnchor", "FileAnchor", "anchor_of"]

ANCHOR_META = "privacy_ledger"
"""The key of the anchor in the sealed store's catalog metadata."""
_FORMAT = 1


@dataclass(frozen=True)
class Anchor:
    """A ledger's head, what it has spent, and its events composed per mechanism.

    Attributes
    ----------
    head:
        Where the ledger's chain ended when it was anchored.
    spent:
        ε recorded per guarantee (the largest ``epsilon_after``).
    carried:
        ``(event, ε after)`` per distinct mechanism, steps summed: composing them gives
        what the ledger's events compose to (same mechanism k then m times = k + m times).
    budget, accountant:
        The ledger's effective budget and its accountant.
    """

    head: LedgerHead
    spent: Mapping[Guarantee, float]
    carried: tuple[tuple[DPEvent, float], ...]
    budget: Budget
    accountant: AccountantKind

    def to_dict(self) -> dict[str, Any]:
        """JSON form, as stored."""
        return {
            "format": _FORMAT,
            "head": self.head.to_dict(),
            "spent": {g.value: eps for g, eps in sorted(self.spent.items())},
            "carried": [[event.to_dict(), eps] for event, eps in self.carried],
            "budget": self.budget.to_dict(),
            "accountant": self.accountant.value,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Anchor:
        """The anchor :meth:`to_dict` wrote.

        Raises
        ------
        StoreError
            If ``doc`` is not one (one line).
        """
        try:
            if doc["format"] != _FORMAT:
                raise ValueError(f"format {doc['format']!r}")
            return cls(
                head=LedgerHead.from_dict(doc["head"]),
                spent={Guarantee(g): float(eps) for g, eps in doc["spent"].items()},
                carried=tuple((DPEvent.from_dict(event), float(eps)) for event, eps in doc["carried"]),
                budget=Budget(**doc["budget"]),
                accountant=AccountantKind(doc["accountant"]),
            )
        except (KeyError, TypeError, ValueError, ConfigError, PrivacyError) as exc:
            raise StoreError(
                f"the privacy ledger's anchor is unreadable ({exc}); restore the store from a backup"
            ) from None

    def same_spend(self, other: Anchor) -> bool:
        """True if ``other`` anchors the same ledger, spend, composed events, budget and accountant
        (its head may differ: further on by commit rows, which change none of them)."""
        return self.head.ledger_id == other.head.ledger_id and replace(other, head=self.head) == self

    def describe(self) -> str:
        """``"a ledger of 7 rows (ε spent 2.95)"``, for messages."""
        eps = max(self.spent.values(), default=0.0)
        return f"a ledger of {self.head.length} rows (ε spent {eps:.3g})"


def anchor_of(head: LedgerHead, snapshot: Snapshot, accountant: AccountantKind) -> Anchor:
    """The anchor of a ledger whose chain ends at ``head`` and holds ``snapshot``."""
    spent: dict[Guarantee, float] = {}
    steps: dict[tuple[Guarantee, float, float], int] = {}
    for entry in snapshot.entries:
        g = entry.event.guarantee
        spent[g] = max(spent.get(g, 0.0), entry.epsilon_after)
        mechanism = (g, entry.event.noise_multiplier, entry.event.sample_rate)
        steps[mechanism] = steps.get(mechanism, 0) + entry.event.steps
    carried = tuple(
        (DPEvent(g, sigma, q, n), spent[g]) for (g, sigma, q), n in sorted(steps.items(), key=lambda kv: repr(kv[0]))
    )
    return Anchor(head, spent, carried, snapshot.budget, accountant)


class AnchorStore(Protocol):
    """Keeps a site's ledger anchor outside the ledger file."""

    def read(self) -> Anchor | None:
        """The anchor, or None if none was ever written."""
        ...

    def write(self, anchor: Anchor) -> None:
        """Replace the anchor, durably."""
        ...


class CatalogAnchor:
    """The anchor in the catalog metadata of the site's sealed store at ``root``.

    The catalog is authenticated under the store key, so the anchor cannot be edited or
    removed without it; it survives model saves (they set other metadata keys). A site's
    reservation is anchored in the commit that saves the model the train message caught up
    to (:class:`~fedshard.site._resident.PendingSave`): one store commit per private round.
    """

    def __init__(self, root: str | Path, kek: Kek, kept: KeptStore | None = None) -> None:
        from fedshard.store.kept import KeptStore

        self.root = root
        self.kek = kek
        self.kept = kept if kept is not None else KeptStore(root, kek)
        """The store, opened once and kept while unchanged (the site's model store passes its own)."""

    def read(self) -> Anchor | None:
        """The anchor, or None if the store or its anchor does not exist."""
        from fedshard.store.catalog import CATALOG
        from fedshard.store.location import backend_for

        if not self.kept.is_open() and backend_for(self.root).read(CATALOG) is None:
            return None
        with self.kept.use() as store:
            doc = store.get_meta(ANCHOR_META)
        return None if doc is None else Anchor.from_dict(doc)

    def joins(self, root: str | Path) -> bool:
        """Whether the anchor lives in the catalog of the store at ``root`` (so a commit there can carry it)."""
        return str(self.root) == str(root)

    @staticmethod
    def entry(anchor: Anchor) -> dict[str, Any]:
        """The catalog metadata that records ``anchor``, for a commit that carries it with other changes."""
        return {ANCHOR_META: anchor.to_dict()}

    def write(self, anchor: Anchor) -> None:
        """Set the anchor in one catalog commit.

        Raises
        ------
        StoreError
            If there is no store at ``root`` (the site saves its model there first).
        """
        with self.kept.use() as store:
            for key, value in self.entry(anchor).items():
                store.set_meta(key, value)


class FileAnchor:
    """The anchor in a small JSON file at ``path``, authenticated with the ledger key.

    Weaker than :class:`CatalogAnchor` when the file sits beside the ledger (deleting
    both goes unnoticed by the site; the coordinator's copy of the head still catches
    it within a run): keep it elsewhere when you can.
    """

    def __init__(self, path: Path, key: LedgerKey) -> None:
        self.path = Path(path)
        self.key = key

    def read(self) -> Anchor | None:
        """The anchor, or None if the file does not exist."""
        try:
            doc = json.loads(self.path.read_text())
            body, mac = doc["anchor"], bytes.fromhex(doc["mac"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            raise StoreError(f"privacy ledger anchor {self.path} is unreadable; restore it from a backup") from None
        if not hmac.compare_digest(mac, self._mac(body)):
            raise StoreError(f"privacy ledger anchor {self.path} was edited (its MAC does not match); restore it")
        return Anchor.from_dict(body)

    def write(self, anchor: Anchor) -> None:
        """Write the file atomically (temporary file, fsync, rename)."""
        body = anchor.to_dict()
        text = json.dumps({"anchor": body, "mac": self._mac(body).hex()}, sort_keys=True)
        tmp = self.path.with_name(f".{self.path.name}.new")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as fh:
                fh.write(text)
                fh.flush()
                fsync_fd(fh.fileno())
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
        except OSError as exc:
            raise StoreError(f"cannot write privacy ledger anchor {self.path}: {exc.strerror or exc}") from exc

    def _mac(self, body: Mapping[str, Any]) -> bytes:
        return self.key.mac(b"", "anchor", [canonical_text(body, allow_nan=True)])
