"""Key rotation: re-wrap every data key of a store under a new KEK, resumably.

No shard is re-encrypted and the catalog is not rewritten: the data keys are
unchanged, only the key table that holds them (``keys/<g>``, 32 bytes per shard) is
re-sealed (:meth:`fedshard.store.catalog.Catalog.rewrap`). Steps::

    1. journal   write the ``rotation`` object: {from: old KEK id, to: new KEK id};
                 delete leftovers of interrupted writes (stale key tables, temporaries:
                 they may hold data keys under the old KEK)
    2. rewrap    decrypt the key table under the old KEK, seal it under the new one,
                 with the old id added to its retired keys
    3. commit    replace ``keys/<g>`` (one atomic write)
    4. done      delete the journal

Whatever step a crash interrupts, the key table on the backend is wholly sealed under
one of the two KEKs (step 3 is atomic), so every shard stays readable with that key,
and running the rotation again with both keys resumes it: before the commit it
starts over, after it only the journal is left to delete. Once committed, the old
KEK is refused (``StoreKeyError``: retired) by this store.

What rotation does not do: data keys stay the same, so someone who copied the
catalog *and* the old KEK before the rotation can still read the shards. After a
suspected leak, write the shards again (new data keys) instead; rotation is for
retiring a key on schedule or when an operator who held it leaves.

One process at a time: nothing may write the store while it rotates.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedshard.crypto.at_rest import Kek
from fedshard.errors import StoreError, StoreKeyError
from fedshard.store._backend import Backend
from fedshard.store.catalog import CATALOG, KEYS_PREFIX, Catalog, catalog_header, check_kek, keys_header, keys_name

__all__ = ["JOURNAL", "RotationReport", "pending_rotation", "rotate_keys", "store_kek_id"]

JOURNAL = "rotation"  # the object name in the backend
Hook = Callable[[str], None]  # called after each step with its name; tests inject crashes here


@dataclass(frozen=True, slots=True)
class RotationReport:
    """What a rotation did."""

    keys: int  # data keys re-wrapped (0 if the rotation had already been committed)
    old_kek: str
    new_kek: str
    resumed: bool  # an interrupted rotation was found and finished
    seconds: float  # time of steps 2-3 (re-wrap and commit)


def pending_rotation(backend: Backend) -> dict[str, Any] | None:
    """The journal of an interrupted rotation, or ``None``."""
    raw = backend.read(JOURNAL)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return {"from": str(doc["from"]), "to": str(doc["to"]), "started": float(doc["started"])}
    except (ValueError, KeyError, TypeError):
        return {"from": "?", "to": "?", "started": 0.0}


def _current_table(backend: Backend) -> str:
    """Name of the key table the catalog names.

    A committed store has exactly one key table; only a crash mid-commit leaves two, and
    then the catalog says which is current. So the (large) catalog is read only then.
    """
    tables = backend.list(KEYS_PREFIX)
    if len(tables) == 1:
        return tables[0]
    raw = backend.read(CATALOG)
    if raw is None:
        raise StoreError(f"no shard store at {backend.location} (no catalog)")
    return keys_name(int(catalog_header(raw)["generation"]))


def store_kek_id(backend: Backend) -> str:
    """Id of the KEK the store's key table is sealed under (read from its header, not authenticated)."""
    raw_keys = backend.read(_current_table(backend))
    if raw_keys is None:
        raise StoreError(f"the key table of store {backend.location} is missing; restore it from a backup")
    return str(keys_header(raw_keys)["kek"])


def rotate_keys(backend: Backend, old: Kek, new: Kek, *, hook: Hook | None = None) -> RotationReport:
    """Re-wrap every data key of the store on ``backend`` from ``old`` to ``new`` (or resume doing so).

    Parameters
    ----------
    backend:
        The store's backend.
    old, new:
        The current KEK and the one to rotate to.
    hook:
        Called with ``"journal"``, ``"rewrap"``, ``"commit"``, ``"done"`` after each step.

    Raises
    ------
    StoreKeyError
        ``old`` is not the store's KEK (and the store is not already under ``new``),
        or ``new`` equals ``old``.
    """
    step = hook or (lambda _name: None)
    if old == new:
        raise StoreKeyError(f"the new key is the current key (id {old.kek_id}): generate a new one first")
    table = _current_table(backend)
    raw_keys = backend.read(table)
    if raw_keys is None:
        raise StoreError(f"the key table of store {backend.location} ({table}) is missing; restore it from a backup")
    journal = pending_rotation(backend)
    header = keys_header(raw_keys)
    if header["kek"] == new.kek_id:
        raw = backend.read(CATALOG)
        if raw is None:
            raise StoreError(f"no shard store at {backend.location} (no catalog)")
        Catalog.unseal(raw, raw_keys, new)  # authenticates: the rotation was committed
        backend.delete(JOURNAL)
        step("done")
        return RotationReport(0, old.kek_id, new.kek_id, resumed=journal is not None, seconds=0.0)
    check_kek(header, old)  # the clear "not this store's key" / "retired" error
    backend.write(JOURNAL, json.dumps({"from": old.kek_id, "to": new.kek_id, "started": time.time()}).encode())
    for name in backend.list(KEYS_PREFIX):
        if name != table:
            backend.delete(name)
    backend.remove_temporaries()
    step("journal")
    t0 = time.perf_counter()
    rewrapped = Catalog.rewrap(raw_keys, old, new)
    step("rewrap")
    backend.write(table, rewrapped)
    seconds = time.perf_counter() - t0
    step("commit")
    backend.delete(JOURNAL)
    step("done")
    return RotationReport(int(header["count"]), old.kek_id, new.kek_id, resumed=journal is not None, seconds=seconds)
