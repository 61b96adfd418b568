"""What a zone records of its rounds on disk, so that a restart knows which it lost.

A zone's running sums live in memory, so a zone killed while a round is open loses
that round: the contributions it had folded are gone, and the sites cannot push them
again under the same ledger reservation. A restarted zone must say so, not accept new
pushes into an empty sum. So each round leaves one small record in ``rounds/`` of the
zone's store, ``<round, six digits>.json``, replaced atomically at each step (written
to a temporary file, fsynced, renamed, the folder fsynced):

* ``open`` before the zone accepts anything for the round;
* ``published`` after *every* aggregate of the round is stored (it lists their groups);
* ``aborted`` when the coordinator discards the round while it is open;
* ``lost`` when a restart finds the round still ``open``.

Stored format 1 (``format`` in each record), and its contract: a stored record never
changes meaning; a round's state only moves ``open`` → ``published`` | ``aborted`` |
``lost`` (an aborted round, like one that never opened, may be opened again). What a
restart does with them: :mod:`fedshard.zone.recovery`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from fedshard._fs import fsync_dir
from fedshard.errors import StoreError

__all__ = ["JOURNAL_DIR", "JOURNAL_FORMAT", "RoundJournal", "RoundRecord", "RoundState"]

JOURNAL_DIR = "rounds"
"""The folder of round records, in a zone's store."""
JOURNAL_FORMAT = 1
"""Format of the round records (see the module docstring)."""

_NAME = re.compile(r"^(\d{6,})\.json$")


class RoundState(StrEnum):
    """Where a round stands at a zone, as recorded on disk."""

    OPEN = "open"
    PUBLISHED = "published"
    ABORTED = "aborted"
    LOST = "lost"


@dataclass(frozen=True)
class RoundRecord:
    """One round's record: its state and, once published, the groups of its aggregates."""

    round: int
    state: RoundState
    groups: tuple[str, ...] = ()


class RoundJournal:
    """The round records of one zone's store.

    Parameters
    ----------
    root:
        The folder of the records (``<store>/rounds``); created on the first write.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, round: int) -> Path:
        """The record file of ``round``."""
        return self.root / f"{round:06d}.json"

    def write(self, round: int, state: RoundState, groups: tuple[str, ...] = ()) -> None:
        """Record ``round`` in ``state`` (durably, replacing its earlier record).

        Raises
        ------
        StoreError
            The record cannot be written (the zone must not go on as if it were).
        """
        body = {"format": JOURNAL_FORMAT, "round": round, "state": state.value, "groups": list(groups)}
        data = json.dumps(body, sort_keys=True).encode() + b"\n"
        try:
            fresh = not self.root.exists()
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{round:06d}.", suffix=".tmp", dir=self.root)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path(round))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            fsync_dir(self.root)
            if fresh:
                fsync_dir(self.root.parent)
        except OSError as exc:
            raise StoreError(f"cannot record round {round} in {self.root}: {exc.strerror or exc}") from None

    def load(self) -> tuple[dict[int, RoundRecord], list[str]]:
        """Every round's record, and one line for each file that is not a record (left as it is).

        Leftover temporary files (a write cut short) are removed.
        """
        records: dict[int, RoundRecord] = {}
        notes: list[str] = []
        if not self.root.is_dir():
            return records, notes
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # never renamed into place: the write it belonged to did not finish
                continue
            match = _NAME.match(path.name)
            record = _parse(path) if match else None
            if record is None or record.round != int(match.group(1) if match else -1):
                notes.append(f"round record {path} is not one this zone wrote; left as it is")
                continue
            records[record.round] = record
        return records, notes


def _parse(path: Path) -> RoundRecord | None:
    try:
        body = json.loads(path.read_bytes())
        if body.get("format") != JOURNAL_FORMAT:
            return None
        return RoundRecord(int(body["round"]), RoundState(body["state"]), tuple(str(g) for g in body["groups"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
