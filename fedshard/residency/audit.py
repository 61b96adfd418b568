"""Append-only, hash-chained, signed audit log of a zone's decisions (JSON lines).

Each line is one record, canonical JSON, keys in a fixed order::

    {"seq":1,"time":1700000000.5,"decision":"accepted",<fields, sorted>,"prev":"00…00","hash":"9f…"}

``seq`` counts lines from 1, ``prev`` is the ``hash`` of the line before (:data:`GENESIS`
for the first) and::

    hash = sha256(bytes.fromhex(prev) ‖ canonical JSON of the record without "hash")

where canonical JSON sorts keys at every level, has no spaces and escapes non-ASCII.
Changing, removing, inserting or moving a line therefore breaks the chain at that
line, and :func:`verify_audit_log` names it.

A chain alone cannot show records *appended* by someone who can write the file, nor
records cut off its *end*. So a zone with a key (mutual TLS) signs its head after
every append, in ``audit.head.json`` next to the log (format:
:mod:`fedshard.residency.audit_head`): records after the signed head, a head the
chain does not reach or no longer matches, and a signature by another key are all
reported. A head lost in a crash between an append and its signature (or records
appended while the zone was down) is not silently signed over: on reopening, the
zone appends an ``adopted`` record naming the unsigned lines, and verification
reports them unless told to accept them. Rolling back log *and* head file together
to an earlier signed state is not detectable from the files alone: anchor the head
elsewhere too (``audit_head`` in round summaries) and pass it as ``expected_head``.
Without a key (``--insecure``) the log is unsigned, and verification says so.

An :class:`AuditLog` continues an existing file's chain, refuses a file whose chain
(or signed head) is broken (it is evidence: keep it, start a new one), takes an
exclusive lock so that two processes never interleave lines, and serialises appends
from many threads.

Stability contract: a stored record never changes meaning; the reserved keys, the
hash rule and the ``adopted`` record's fields (``unsigned_from``, ``unsigned_to``,
``cause``) stay as written here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from fedshard.errors import PkiError, StoreError
from fedshard.residency.audit_head import (
    HeadFile,
    HeadSignature,
    HeadSigner,
    HeadVerifier,
    SignedHead,
    head_path,
    read_head,
)

if sys.platform != "win32":
    import fcntl

__all__ = [
    "GENESIS",
    "Adoption",
    "AuditLog",
    "AuditRecord",
    "AuditVerdict",
    "Decision",
    "HeadSignature",
    "HeadSigner",
    "HeadVerifier",
    "verify_audit_log",
]

_log = logging.getLogger(__name__)

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
    ADOPTED = "adopted"
    """Written by the log itself on reopening: lines it found without a signed head."""


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
class Adoption:
    """Lines the zone found without a signed head when it reopened its log, and adopted.

    Attributes
    ----------
    first, last:
        The unsigned lines (1-based, inclusive).
    at:
        The line of the ``adopted`` record that names them.
    cause:
        Why they were unsigned, as the zone saw it.
    """

    first: int
    last: int
    at: int
    cause: str


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
        Why that line (or the signed head) does not verify; ``None`` when ``ok``.
    signed:
        Who signed the head and how many lines it covers; ``None`` for an unsigned log.
    adopted:
        Lines written without a signature and adopted by the zone on reopening.
    decisions:
        How many verified records there are of each decision.
    """

    ok: bool
    lines: int
    head: str
    first_bad_line: int | None = None
    reason: str | None = None
    signed: HeadSignature | None = None
    adopted: tuple[Adoption, ...] = ()
    decisions: Mapping[str, int] = field(default_factory=dict)


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
    signer:
        The zone's key: sign the head after every append (:mod:`~fedshard.residency.audit_head`).
        Without one the log is unsigned.

    Raises
    ------
    StoreError
        The file cannot be opened, another process has it open, or its chain or
        signed head is broken.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        durable: bool = True,
        signer: HeadSigner | None = None,
    ) -> None:
        self.path = Path(path)
        self.head_path = head_path(self.path)
        self._clock = clock
        self._durable = durable
        self._signer = signer
        self._head_file: HeadFile | None = None
        self._lock = threading.Lock()
        existed = self.path.exists()
        self._fd = _open_locked(self.path)
        self._closed = False
        try:
            with open(self.path, "rb") as fh:
                scan = _scan(fh, self.path)
            verdict = scan.verdict
            if not verdict.ok:
                raise StoreError(
                    f"audit log {self.path} is broken: {verdict.reason}; "
                    "keep it as evidence and start a new log; appending would hide the break"
                )
            self._size = os.fstat(self._fd).st_size
            if durable and not existed and os.name == "posix":
                _fsync_dir(self.path.parent)  # the new file's name must survive a crash too
            self._seq = verdict.lines
            self._head = verdict.head
            self._counts = Counter(verdict.decisions)
            if signer is not None:
                self._resume_signing(signer)
        except BaseException as exc:
            self._release()
            if isinstance(exc, OSError) and not isinstance(exc, StoreError):
                raise StoreError(f"cannot open audit log {self.path}: {exc.strerror or exc}") from None
            raise

    def _resume_signing(self, signer: HeadSigner) -> None:
        """Check the signed head against the chain; adopt unsigned trailing lines; sign the head."""
        where = f"audit log {self.path}"
        try:
            signed = read_head(self.head_path)
        except ValueError as exc:
            raise StoreError(f"{where}: its head file {self.head_path} {exc}; keep both as evidence") from None
        covered = 0
        if signed is not None:
            try:
                HeadVerifier().check(signed)
            except PkiError as exc:
                raise StoreError(f"{where}: {exc}; keep the log and its head file as evidence") from None
            if signed.zone != signer.zone:
                raise StoreError(f"{where} is signed by zone {signed.zone!r}, not {signer.zone!r}: another zone's log")
            problem = _head_problem(self.path, signed, self._seq)
            if problem is not None:
                raise StoreError(f"{where}: {problem}; keep the log and its head file as evidence")
            covered = signed.lines
        # Sign the chain as it is first (so that the head file is this zone's, written
        # atomically), then record any adoption: that record's own head covers it.
        self._head_file = HeadFile(
            self.head_path, signer.sign(covered, signed.head if signed else GENESIS, self._clock())
        )
        if covered < self._seq:
            cause = "no signed head" if signed is None else f"after the signed head (line {covered})"
            _log.warning("%s: lines %d-%d are not signed (%s); adopting them", where, covered + 1, self._seq, cause)
            self.append(Decision.ADOPTED, unsigned_from=covered + 1, unsigned_to=self._seq, cause=cause)

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

    @property
    def signed(self) -> bool:
        """Whether the zone signs this log's head."""
        return self._signer is not None

    def counts(self) -> dict[str, int]:
        """How many records of each decision the log holds (including those before it was reopened)."""
        with self._lock:
            return dict(self._counts)

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
            self._counts[body["decision"]] += 1
            if self._signer is not None:
                self._sign(self._signer)
        fixed = {k: v for k, v in body.items() if k not in _RESERVED}
        return AuditRecord(body["seq"], body["time"], body["decision"], MappingProxyType(fixed), body["prev"], digest)

    def close(self) -> None:
        """Release the file (and its lock); further appends fail."""
        with self._lock:
            if not self._closed:
                self._release()

    def _release(self) -> None:
        self._closed = True
        try:
            if self._head_file is not None:
                self._head_file.close(durable=self._durable)  # fsync once, not per append: see HeadFile
        except OSError as exc:
            _log.error("audit log %s: cannot flush its signed head %s: %s", self.path, self.head_path, exc)
        finally:
            os.close(self._fd)

    def _sign(self, signer: HeadSigner) -> None:
        """Sign the current head and replace the head file (holding ``_lock``, or from ``__init__``)."""
        if self._head_file is None:
            return  # opening failed before the head file was written
        signed = signer.sign(self._seq, self._head, self._clock())
        try:
            self._head_file.write(signed)
        except OSError as exc:
            # The record is written (and durable): failing the append now would make the
            # caller think it was not. The next append signs again; until then verification
            # reports the line as unsigned, and a reopen adopts it.
            _log.error("audit log %s: cannot write its signed head %s: %s", self.path, self.head_path, exc)

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


def verify_audit_log(
    path: str | os.PathLike[str],
    *,
    expected_head: str | None = None,
    verifier: HeadVerifier | None = None,
    allow_adopted: bool = False,
) -> AuditVerdict:
    """Check an audit log's chain line by line, and its signed head.

    Parameters
    ----------
    path:
        The log file; its signed head is read from ``audit.head.json`` beside it.
    expected_head:
        A head recorded earlier (:attr:`AuditLog.head`); the log must still contain it,
        which detects lines removed from the end.
    verifier:
        Checks the head's signature against a pinned zone certificate and/or the
        federation CA; the log must then be signed. Without one, a signature is
        checked against the certificate in the head file only (``signed.trusted``
        is ``False``) and an unsigned log passes (``signed`` is ``None``).
    allow_adopted:
        Accept lines the zone adopted on reopening (see :class:`Adoption`);
        by default they fail verification, since they may have been appended by anyone.

    Returns
    -------
    AuditVerdict
        ``ok``, lines verified, head, the first bad line with the reason, and who signed.

    Notes
    -----
    Checking a log that a zone is writing to may catch its last line half written
    (reported as truncated) or a line not yet signed; check a copy, or check again.

    Raises
    ------
    StoreError
        The file (or its head file) cannot be read.
    """
    p = Path(path)
    hp = head_path(p)
    try:
        with open(p, "rb") as fh:
            scan = _scan(fh, p, expected_head)
    except OSError as exc:
        raise StoreError(f"cannot read audit log {p}: {exc.strerror or exc}") from None
    verdict = scan.verdict
    if not verdict.ok:
        return verdict
    try:
        signed_raw = read_head(hp)
    except ValueError as exc:
        return replace(verdict, ok=False, reason=f"head file {hp} {exc}")
    except OSError as exc:
        raise StoreError(f"cannot read the signed head {hp}: {exc.strerror or exc}") from None
    if signed_raw is None:
        if verifier is not None and verifier.anchored:
            return replace(verdict, ok=False, reason=f"the log is not signed: no head file {hp}")
        return verdict
    try:
        signature = (verifier or HeadVerifier()).check(signed_raw)
    except PkiError as exc:
        return replace(verdict, ok=False, reason=f"head file {hp}: {exc}")
    problem = _head_problem(p, signed_raw, verdict.lines)
    if problem is not None:
        first = verdict.lines + 1 if signed_raw.lines > verdict.lines else signed_raw.lines
        return replace(verdict, ok=False, first_bad_line=first, reason=problem, signed=signature)
    adopted = tuple(a for a in scan.adoptions if a.at <= signed_raw.lines)
    if verdict.lines > signed_raw.lines:
        n, last = signed_raw.lines, verdict.lines
        span = f"line {n + 1} was" if last == n + 1 else f"lines {n + 1}-{last} were"
        reason = f"{span} appended after the head the zone signed (line {n}): not written by the zone"
        return replace(verdict, ok=False, first_bad_line=n + 1, reason=reason, signed=signature, adopted=adopted)
    if adopted and not allow_adopted:
        a = adopted[0]
        reason = (
            f"lines {a.first}-{a.last} were not signed when written ({a.cause}); the zone adopted them "
            f"at line {a.at} when it reopened the log: a crash between an append and its signature, "
            "or records appended while the zone was down; check them, then pass --allow-adopted"
        )
        return replace(verdict, ok=False, first_bad_line=a.first, reason=reason, signed=signature, adopted=adopted)
    return replace(verdict, signed=signature, adopted=adopted)


def _head_problem(path: Path, signed: SignedHead, lines: int) -> str | None:
    """Why the signed head does not match the log's chain of ``lines`` lines; ``None`` if it does."""
    if signed.lines > lines:
        gone = f"line {signed.lines} was" if signed.lines == lines + 1 else f"lines {lines + 1}-{signed.lines} were"
        return f"the signed head covers {signed.lines} lines but the log has {lines}: {gone} removed from its end"
    if signed.lines == 0:
        at = GENESIS
    else:
        with open(path, "rb") as fh:
            at = _hash_at(fh, signed.lines)
    if at != signed.head:
        return f"line {signed.lines} does not match the signed head: the log was rewritten up to there"
    return None


def _hash_at(fh: BinaryIO, number: int) -> str:
    for n, raw in enumerate(_lines(fh), start=1):
        if n == number:
            return str(json.loads(raw)["hash"])
    return ""


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


@dataclass(frozen=True)
class _Scan:
    verdict: AuditVerdict
    adoptions: tuple[Adoption, ...]


def _scan(fh: BinaryIO, path: Path, expected_head: str | None = None) -> _Scan:
    head, count, seen = GENESIS, 0, expected_head is None
    decisions: Counter[str] = Counter()
    adoptions: list[Adoption] = []
    for number, raw in enumerate(_lines(fh), start=1):
        try:
            head, record = _check_line(raw, number, head)
        except _BadLineError as bad:
            verdict = AuditVerdict(False, count, head, number, f"line {number} {bad}", decisions=dict(decisions))
            return _Scan(verdict, tuple(adoptions))
        count = number
        seen = seen or head == expected_head
        decisions[record["decision"]] += 1
        if record["decision"] == Decision.ADOPTED:
            first, last = record.get("unsigned_from"), record.get("unsigned_to")
            if isinstance(first, int) and isinstance(last, int):
                adoptions.append(Adoption(first, last, number, str(record.get("cause", ""))))
    if not seen:
        reason = f"head {expected_head} is not in the log: lines were removed from its end"
        return _Scan(AuditVerdict(False, count, head, count + 1, reason, decisions=dict(decisions)), tuple(adoptions))
    return _Scan(AuditVerdict(True, count, head, decisions=dict(decisions)), tuple(adoptions))


def _lines(fh: BinaryIO) -> Iterator[bytes]:
    # readline keeps the newline, so a last line without one (an append cut short) shows.
    while raw := fh.readline():
        yield raw


def _check_line(raw: bytes, number: int, prev: str) -> tuple[str, dict[str, Any]]:
    """The line's hash and record if it follows ``prev`` correctly; :class:`_BadLineError` saying why not."""
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
    return str(digest), record


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
