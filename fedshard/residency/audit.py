"""Append-only, hash-chained audit log of a zone's residency decisions (JSON lines).

Each line is one record, canonical JSON, keys in a fixed order::

    {"seq":1,"time":1700000000.5,"decision":"accepted",<fields, sorted>,"prev":"00…00","hash":"9f…"}

``seq`` counts lines from 1, ``prev`` is the ``hash`` of the line before (:data:`GENESIS`
for the first) and::

    hash = sha256(bytes.fromhex(prev) ‖ canonical JSON of the record without "hash")

where canonical JSON sorts keys at every level, has no spaces and escapes non-ASCII.
Changing, removing, inserting or moving a line therefore breaks the chain at that
line, and :func:`verify_audit_log` names it. Removing lines from the *end* leaves a
shorter valid chain; to detect that, keep the :attr:`AuditLog.head` somewhere else
(a signed round summary, another machine) and pass it as ``expected_head``.

An :class:`AuditLog` continues an existing file's chain, refuses a file whose chain
is broken (it is evidence: keep it, start a new one), takes an exclusive lock so
that two processes never interleave lines, and serialises appends from many threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from fedshard.errors import StoreError

if sys.platform != "win32":
    import fcntl

__all__ = ["GENESIS", "AuditLog", "AuditRecord", "AuditVerdict", "Decision", "verify_audit_log"]

GENESIS = "0" * 64
"""``prev`` of the first record."""

_RESERVED = frozenset({"seq", "time", "decision", "prev", "hash"})
_FILE_MODE = 0o640


class Decision(StrEnum):
    """Decisions a zone records; :meth:`AuditLog.append` also takes any other non-empty string."""

    ACCEPTED = "accepted"
    REFUSED = "refused"
    FORWARDED = "forwarded"
    PUBLISHED = "published"
    SERVED = "served"


@dataclass(frozen=True)
class AuditRecord:
    """One line of the audit log, as written."""

    seq: int
    time: float
    decision: str
    fields: Mapping[str, Any]
    prev: str
    hash: str

    def as_dict(self) -> dict[str, Any]:
        """The record as one flat mapping, in line order."""
        head = {"seq": self.seq, "time": self.time, "decision": self.decision}
        return {**head, **self.fields, "prev": self.prev, "hash": self.hash}


@dataclass(frozen=True)
class AuditVerdict:
    """Result of :func:`verify_audit_log`.

    Attributes
    ----------
    ok:
        Whether every line verifies (and ``expected_head``, if given, was found).
    lines:
        Number of lines that verify, counted from the top.
    head:
        Hash of the last line that verifies (:data:`GENESIS` if none).
    first_bad_line:
        1-based number of the first line that does not verify; ``None`` when ``ok``.
    reason:
        Why that line does not verify; ``None`` when ``ok``.
    """

    ok: bool
    lines: int
    head: str
    first_bad_line: int | None = None
    reason: str | None = None


class AuditLog:
    """Appends hash-chained records to a JSON-lines file.

    Parameters
    ----------
    path:
        The log file; created (mode ``0640``) if missing, continued if present.
    clock:
        Returns the current time in seconds (for tests); default :func:`time.time`.
    durable:
        ``fsync`` after every append, so an acknowledged decision survives a crash.

    Raises
    ------
    StoreError
        The file cannot be opened, another process has it open, or its chain is broken.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time, durable: bool = True
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._durable = durable
        self._lock = threading.Lock()
        existed = self.path.exists()
        self._fd = _open_locked(self.path)
        try:
            with open(self.path, "rb") as fh:
                verdict = _scan(fh, self.path)
            if not verdict.ok:
                raise StoreError(
                    f"audit log {self.path} is broken: {verdict.reason}; "
                    "keep it as evidence and start a new log; appending would hide the break"
                )
            self._size = os.fstat(self._fd).st_size
            if durable and not existed and os.name == "posix":
                _fsync_dir(self.path.parent)  # the new file's name must survive a crash too
        except StoreError:
            os.close(self._fd)
            raise
        except OSError as exc:
            os.close(self._fd)
            raise StoreError(f"cannot open audit log {self.path}: {exc.strerror or exc}") from None
        except BaseException:
            os.close(self._fd)
            raise
        self._seq = verdict.lines
        self._head = verdict.head
        self._closed = False

    @property
    def head(self) -> str:
        """Hash of the last record (:data:`GENESIS` for an empty log); anchor it elsewhere."""
        with self._lock:
            return self._head

    @property
    def lines(self) -> int:
        """Number of records in the log."""
        with self._lock:
            return self._seq

    def append(self, decision: str, **fields: Any) -> AuditRecord:
        """Append one record and return it.

        Parameters
        ----------
        decision:
            What was decided (a :class:`Decision` or another non-empty string).
        **fields:
            JSON values describing it (site, round, shard ids, reason, ...); the names
            ``seq``, ``time``, ``decision``, ``prev`` and ``hash`` are reserved.

        Raises
        ------
        StoreError
            The log is closed or cannot be written; nothing was appended.
        """
        if not isinstance(decision, str) or not decision:
            raise ValueError(f"decision must be a non-empty string, got {decision!r}")
        clash = _RESERVED.intersection(fields)
        if clash:
            raise ValueError(f"audit field names {sorted(clash)} are reserved; rename them")
        for name, value in fields.items():
            try:
                _canonical(value)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"audit field {name!r} is not a finite JSON value ({exc})") from None
        with self._lock:
            if self._closed:
                raise StoreError(f"audit log {self.path} is closed")
            body: dict[str, Any] = {"seq": self._seq + 1, "time": self._clock(), "decision": str(decision)}
            body.update(sorted(fields.items()))
            body["prev"] = self._head
            digest = record_hash(body)
            line = _render({**body, "hash": digest}) + b"\n"
            self._write(line)
            self._seq += 1
            self._head = digest
        fixed = {k: v for k, v in body.items() if k not in _RESERVED}
        return AuditRecord(body["seq"], body["time"], body["decision"], MappingProxyType(fixed), body["prev"], digest)

    def close(self) -> None:
        """Release the file (and its lock); further appends fail."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._fd)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, line: bytes) -> None:
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
            if self._durable:
                os.fsync(self._fd)
        except OSError as exc:
            # Cut a partial line off again so that the chain stays valid for the next append;
            # if even that fails, stop appending rather than write after half a line.
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._closed = True
                os.close(self._fd)
            raise StoreError(f"cannot append to audit log {self.path}: {exc.strerror or exc}") from None
        self._size += len(line)


def verify_audit_log(path: str | os.PathLike[str], *, expected_head: str | None = None) -> AuditVerdict:
    """Check an audit log's chain line by line.

    Parameters
    ----------
    path:
        The log file.
    expected_head:
        A head recorded earlier (:attr:`AuditLog.head`); the log must still contain it,
        which detects lines removed from the end.

    Returns
    -------
    AuditVerdict
        ``ok``, lines verified, head, and the first bad line with the reason.

    Notes
    -----
    Checking a log that a zone is writing to may catch its last line half written
    (reported as truncated); check a copy, or check again.

    Raises
    ------
    StoreError
        The file cannot be read.
    """
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            return _scan(fh, p, expected_head)
    except OSError as exc:
        raise StoreError(f"cannot read audit log {p}: {exc.strerror or exc}") from None


def record_hash(body: Mapping[str, Any]) -> str:
    """``sha256(bytes.fromhex(body["prev"]) ‖ canonical JSON of body)``, hex; ``body`` has no ``hash``."""
    return hashlib.sha256(bytes.fromhex(body["prev"]) + _canonical(body)).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _render(record: Mapping[str, Any]) -> bytes:
    """The line of a record: reserved keys around the fields, every value canonical."""
    head = ("seq", "time", "decision")
    order = [*head, *sorted(k for k in record if k not in _RESERVED), "prev", "hash"]
    parts = [_canonical(k) + b":" + _canonical(record[k]) for k in order]
    return b"{" + b",".join(parts) + b"}"


def _scan(fh: BinaryIO, path: Path, expected_head: str | None = None) -> AuditVerdict:
    head, count, seen = GENESIS, 0, expected_head is None
    for number, raw in enumerate(_lines(fh), start=1):
        try:
            head = _check_line(raw, number, head)
        except _BadLineError as bad:
            return AuditVerdict(False, count, head, number, f"line {number} {bad}")
        count = number
        seen = seen or head == expected_head
    if not seen:
        reason = f"head {expected_head} is not in the log: lines were removed from its end"
        return AuditVerdict(False, count, head, count + 1, reason)
    return AuditVerdict(True, count, head)


def _lines(fh: BinaryIO) -> Iterator[bytes]:
    # readline keeps the newline, so a last line without one (an append cut short) shows.
    while raw := fh.readline():
        yield raw


def _check_line(raw: bytes, number: int, prev: str) -> str:
    """The line's hash if it follows ``prev`` correctly; :class:`_BadLineError` saying why not otherwise."""
    if not raw.endswith(b"\n"):
        raise _BadLineError("is truncated (no newline at the end): an append did not finish")
    try:
        record = json.loads(raw[:-1], parse_constant=_refuse_constant)
    except ValueError:
        raise _BadLineError("is not valid JSON") from None
    if not _is_record(record):
        raise _BadLineError("is not an audit record (seq, time, decision, prev or hash missing or mistyped)")
    body = {k: v for k, v in record.items() if k != "hash"}
    try:
        digest = record_hash(body)
    except ValueError:
        raise _BadLineError("has a malformed prev hash") from None
    if digest != record["hash"]:
        raise _BadLineError("was altered: its hash does not match its content")
    if _render(record) != raw[:-1]:
        raise _BadLineError("is not in canonical form: it was edited")
    if record["seq"] != number:
        raise _BadLineError(f"has seq {record['seq']}, expected {number}: lines were removed, inserted or moved")
    if record["prev"] != prev:
        raise _BadLineError("does not follow the line before it: lines were removed, inserted or moved")
    return str(digest)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: json.loads would accept them


class _BadLineError(Exception):
    """Why a line does not verify (internal to :func:`_scan`)."""


def _is_record(record: object) -> bool:
    if not isinstance(record, dict):
        return False
    seq, when = record.get("seq"), record.get("time")
    return (
        isinstance(seq, int)
        and not isinstance(seq, bool)
        and isinstance(when, int | float)
        and not isinstance(when, bool)
        and isinstance(record.get("decision"), str)
        and all(isinstance(record.get(k), str) and len(record[k]) == 64 for k in ("prev", "hash"))
    )


def _open_locked(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, _FILE_MODE)
    except OSError as exc:
        raise StoreError(f"cannot open audit log {path}: {exc.strerror or exc}") from None
    if sys.platform != "win32":
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"audit log {path} is in use by another process (or another AuditLog)") from None
    return fd


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
