"""A zone coming back on its store after a crash: what survived, what was lost, what is cut off.

``fedshard zone up`` started again on the folder of a zone that was killed finds:

* its **audit log**, whose last line may be torn (an append cut short: no newline).
  That record was never acknowledged, so it is cut off the log and kept beside it as
  ``audit.jsonl.torn`` (:func:`repair_audit_tail`); the lines before it are then
  verified as ever, and a log broken anywhere else is still refused.
* its **published aggregates**, each read back and checked against its Merkle root. One
  that does not read back (half written: a write cut short, or a damaged disk) is moved
  to ``discarded/`` in the store and never served; a leftover temporary file of a write
  that never finished is removed; one that reads back but fails its root was altered
  after the zone wrote it and stays where it is, as evidence, refused to whoever fetches
  it (code ``corrupt``). The others are kept as they are.
* its **round records** (:mod:`fedshard.zone._journal`): a round still ``open`` was lost
  with the sums held in memory. It is recorded ``lost``, the zone refuses pushes,
  forwards and its close with code ``round`` (the coordinator then aborts it), and any
  of its aggregates stored before the crash (a publish cut short) are discarded, so no
  partial round is ever served.

Each finding is one line (:attr:`ZoneRecovery.notes`): the command prints them and the zone
writes them to its audit log (a ``recovered`` record).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fedshard.errors import IntegrityError, StoreError
from fedshard.protocol.rounds import AggregateSummary
from fedshard.zone._journal import RoundJournal, RoundState
from fedshard.zone._publish import AggregateStore

__all__ = ["DISCARDED_DIR", "ZoneRecovery", "recover_rounds", "repair_audit_tail"]

log = logging.getLogger(__name__)

DISCARDED_DIR = "discarded"
"""Where a zone moves stored aggregates it will not serve (in its store)."""


@dataclass
class ZoneRecovery:
    """What a zone found in its store when it started."""

    lost: set[int] = field(default_factory=set)
    """Rounds that were open when the zone stopped: lost, refused with code ``round``."""
    closed: set[int] = field(default_factory=set)
    """Rounds published before: never opened again (closing one again answers its summaries)."""
    summaries: list[AggregateSummary] = field(default_factory=list)
    """The published aggregates that verify."""
    notes: list[str] = field(default_factory=list)
    """One line per finding that needs a reader (nothing: a clean start)."""


def repair_audit_tail(path: str | Path) -> str | None:
    """Cut a torn last line (no newline: an append the crash cut short) off the audit log
    at ``path``, keeping its bytes in ``<path>.torn``; the line that says so, or None if
    the log ends cleanly (or does not exist). Nothing before the torn line is touched."""
    path = Path(path)
    if not path.exists():
        return None
    with open(path, "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return None
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return None
        cut = _after_last_newline(fh, size)
        fh.seek(cut)
        torn = fh.read()
        kept = path.with_name(path.name + ".torn")
        with open(kept, "ab") as out:  # several crashes: every torn tail kept, in order
            out.write(torn + b"\n")
            out.flush()
            os.fsync(out.fileno())
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    note = (
        f"audit log {path}: its last line was torn ({len(torn)} bytes, an append the crash cut short); "
        f"cut off and kept in {kept}, the lines before it kept"
    )
    log.warning("%s", note)
    return note


def _after_last_newline(fh: IO[bytes], size: int) -> int:
    """Offset just after the last newline of the file (0: none), read backwards in blocks."""
    end = size
    while end > 0:
        start = max(0, end - (64 << 10))
        fh.seek(start)
        block = fh.read(end - start)
        at = block.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def recover_rounds(zone: str, store_dir: str | Path, journal: RoundJournal, store: AggregateStore) -> ZoneRecovery:
    """Read a zone's round records and aggregates after a start (see the module docstring).

    Rounds still ``open`` are recorded ``lost`` and their stored aggregates discarded;
    every published aggregate is checked against its Merkle root.
    """
    root = Path(store_dir)
    found = ZoneRecovery()
    for tmp in sorted(root.glob(".aggregate-*.tmp")):
        tmp.unlink(missing_ok=True)
        found.notes.append(f"zone {zone}: removed {tmp.name}, an aggregate whose write the crash cut short")
    records, notes = journal.load()
    found.notes += [f"zone {zone}: {n}" for n in notes]
    for rnd, record in sorted(records.items()):
        if record.state in (RoundState.OPEN, RoundState.LOST):
            if record.state is RoundState.OPEN:
                journal.write(rnd, RoundState.LOST)
                found.notes.append(
                    f"zone {zone}: round {rnd} was open when the zone stopped; its partial sums are lost, so "
                    "the coordinator discards it here and opens it afresh (or, with DP on, skips it: sites "
                    "may have charged it)"
                )
            found.lost.add(rnd)
            for path in sorted(root.glob(f"aggregate-{rnd:06d}-*.npz")):
                found.notes.append(_discard(zone, root, path, f"an aggregate of round {rnd}, which never finished"))
            continue
        if record.state is RoundState.ABORTED:  # nothing kept; the coordinator may open it again
            continue
        found.closed.add(rnd)
        for group in record.groups:
            try:
                loaded = store.load(zone, rnd, group)
            except IntegrityError as exc:  # whole, but not what the zone wrote: evidence, refused when fetched
                found.notes.append(f"{exc}; kept as it is (evidence), refused to whoever fetches it")
                continue
            except StoreError as exc:  # does not even read back: a write cut short (or a damaged disk)
                path = root / f"{store.key(rnd, group)}.npz"
                found.notes.append(_discard(zone, root, path, f"it does not read back ({exc})"))
                continue
            if loaded is None:
                found.notes.append(f"zone {zone}: aggregate {group} of round {rnd} is missing from {root}")
                continue
            found.summaries.append(loaded[0].summary)
    for note in found.notes:
        log.warning("%s", note)
    return found


def _discard(zone: str, root: Path, path: Path, why: str) -> str:
    """Move ``path`` to the store's ``discarded/`` folder; the line that says so."""
    target = root / DISCARDED_DIR / path.name
    target.parent.mkdir(exist_ok=True)
    os.replace(path, target)
    return f"zone {zone}: moved {path.name} to {DISCARDED_DIR}/: {why}; never served"
