"""Check a whole shard store: every shard, and the Merkle root against the recorded model version.

What counts as a problem (``fedshard verify --store`` exits 1 if there is any):

* a shard that fails its read checks (missing, truncated, swapped, rolled back, altered);
* a shard of the recorded model's plan that the store lacks;
* a Merkle root over the stored shards' full-precision digests that differs from the
  root recorded with the model version;
* a recorded genesis version that does not follow from the plan and the recorded root;
* a recorded model version that differs from the one expected (``--version``);
* a hot shard whose digest differs from its source digest (an inconsistent catalog).

Notes, not problems: shards outside the plan, orphan blobs and temporaries left by
interrupted writes, an interrupted key rotation, no model recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedshard.errors import ShardIntegrityError
from fedshard.integrity.merkle import merkle_root
from fedshard.integrity.version import genesis_version
from fedshard.store.model_io import model_record
from fedshard.store.rotation import pending_rotation
from fedshard.store.sealed_store import SealedShardStore

__all__ = ["Problem", "VerifyReport", "check_store"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the store (``shard_id`` is ``None`` for the store as a whole)."""

    shard_id: str | None
    message: str


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of :func:`check_store`."""

    shards: int
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_version: str | None = None
    root: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        return {
            "ok": self.ok,
            "shards": self.shards,
            "model_version": self.model_version,
            "root": self.root,
            "problems": [{"shard": p.shard_id, "message": p.message} for p in self.problems],
            "notes": self.notes,
        }


def check_store(store: SealedShardStore, expected_version: str | None = None) -> VerifyReport:
    """Read and check every shard of ``store``, then its Merkle root and model version.

    Reads do not count as accesses (tiering is not affected).
    """
    problems: list[Problem] = []
    notes: list[str] = []
    entries = store.entries()
    for sid in sorted(entries):
        try:
            store.get(sid, touch=False)
        except ShardIntegrityError as exc:
            problems.append(Problem(sid, str(exc)))
            continue
        entry = entries[sid]
        if not entry.cold and entry.digest != entry.source_digest:
            problems.append(Problem(sid, f"shard {sid}: the catalog's digests disagree for a hot shard"))

    record = model_record(store)
    version = root = None
    if record is None:
        message = "the store records no model version"
        if expected_version is not None:
            problems.append(Problem(None, f"{message}; expected {expected_version}"))
        else:
            notes.append(message)
    else:
        version = record.version
        plan_ids = record.plan.shard_ids
        missing = [sid for sid in plan_ids if sid not in entries]
        problems.extend(Problem(sid, f"shard {sid} of the model's plan is not in the store") for sid in missing)
        extra = len(set(entries) - set(plan_ids))
        if extra:
            notes.append(f"{extra} shard(s) outside the model's plan (not covered by its Merkle root)")
        root = merkle_root({sid: entries[sid].source_digest for sid in plan_ids if sid in entries})
        if root != record.root:
            problems.append(
                Problem(
                    None,
                    f"Merkle root {root[:12]}… of the stored shards differs from root {record.root[:12]}… "
                    f"recorded with model version {record.version[:12]}…",
                )
            )
        if record.genesis and genesis_version(record.plan.digest, record.root) != record.version:
            problems.append(
                Problem(None, f"model version {record.version[:12]}… is not the genesis of its plan and root")
            )
        if expected_version is not None and record.version != expected_version:
            problems.append(
                Problem(
                    None, f"the store holds model version {record.version[:12]}…, expected {expected_version[:12]}…"
                )
            )
    orphans = store.orphans()
    if orphans:
        notes.append(f"{len(orphans)} orphan blob(s) left by interrupted writes (removed by `fedshard store tier`)")
    temporaries = store.backend.temporaries()
    if temporaries:
        notes.append(f"{len(temporaries)} temporary file(s) left by interrupted writes")
    journal = pending_rotation(store.backend)
    if journal is not None:
        notes.append(f"a key rotation to key {journal['to']} was interrupted: run `fedshard keys rotate` again")
    return VerifyReport(len(entries), problems, notes, version, root)
