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
:mod:`fedshard.audit._head`): records after the signed head, a head the
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
exclusive lock (``audit.jsonl.lock`` beside it, :mod:`filelock`) so that two processes
never interleave lines, and serialises appends
from many threads.

Stability contract: a stored record never changes meaning; the reserved keys, the
hash rule and the ``adopted`` record's fields (``unsigned_from``, ``unsigned_to``,
``cause``) stay as written here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from filelock import FileLock, Timeout

from fedshard._fs import fsync_fd
from fedshard.audit._head import (
    HeadFile,
    HeadSignature,
    HeadSigner,
    HeadVerifier,
    SignedHead,
    head_path,
    read_head,
)
from fedshard.audit._lines import (
    GENESIS,
    RESERVED,
    Adoption,
    AuditVerdict,
    Decision,
    canonical,
    head_problem,
    record_hash,
    render,
)
from fedshard.audit._lines import scan as scan_lines
from fedshard.errors import PkiError, StoreError

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
    "lock_path",
    "record_hash",
    "verify_audit_log",
]

_log = logging.getLogger(__name__)

_FILE_MODE = 0o640


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


class AuditLog:
    """Appends hash-chained records to a JSON-lines file.

    Parameters
    ----------
    path:
        The log file; created (mode ``0640``) if missing, continued if present.
    clock:
        Returns the current time in seconds (for tests); default :func:`time.time`.
    durable:
        ``fsync`` after every append, so an acknowledged decision survives a crash (an
        appender running under a :class:`fedshard._fs.Barrier` covering the log leaves that
        flush to the barrier's ``sync``, and owns the rule that nothing derived from the
        record leaves before it; :meth:`sync` flushes whatever was deferred).
    signer:
        The zone's key: sign the head after every append (:mod:`~fedshard.audit._head`).
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
        self._file_lock = _lock(self.path)
        try:
            self._fd = _open(self.path)
        except BaseException:
            self._file_lock.release()
            raise
        self._closed = False
        try:
            with open(self.path, "rb") as fh:
                scan = scan_lines(fh, self.path)
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
            problem = head_problem(self.path, signed, self._seq)
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
        clash = RESERVED.intersection(fields)
        if clash:
            raise ValueError(f"audit field names {sorted(clash)} are reserved; rename them")
        for name, value in fields.items():
            try:
                canonical(value)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"audit field {name!r} is not a finite JSON value ({exc})") from None
        with self._lock:
            if self._closed:
                raise StoreError(f"audit log {self.path} is closed")
            body: dict[str, Any] = {"seq": self._seq + 1, "time": self._clock(), "decision": str(decision)}
            body.update(sorted(fields.items()))
            body["prev"] = self._head
            digest = record_hash(body)
            line = render({**body, "hash": digest}) + b"\n"
            self._write(line)
            self._seq += 1
            self._head = digest
            self._counts[body["decision"]] += 1
            if self._signer is not None:
                self._sign(self._signer)
        fixed = {k: v for k, v in body.items() if k not in RESERVED}
        return AuditRecord(body["seq"], body["time"], body["decision"], MappingProxyType(fixed), body["prev"], digest)

    def sync(self) -> None:
        """Make every record appended so far durable (one ``fsync``), including those whose
        flush an appender deferred to a barrier (:func:`fedshard._fs.deferred_to`).

        Raises
        ------
        StoreError
            The log is closed or cannot be flushed.
        """
        with self._lock:
            if self._closed:
                raise StoreError(f"audit log {self.path} is closed")
            if not self._durable:
                return
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise StoreError(f"cannot flush audit log {self.path}: {exc.strerror or exc}") from None

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
            self._file_lock.release()

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
                fsync_fd(self._fd)
        except OSError as exc:
            # Cut a partial line off again so that the chain stays valid for the next append;
            # if even that fails, stop appending rather than write after half a line.
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._release()
            raise StoreError(f"cannot append to audit log {self.path}: {exc.strerror or exc}") from None
        self._size += len(line)


def verify_audit_log(
    path: str | os.PathLike[str],
    *,
    expected_head: str | None = None,
    verifier: HeadVerifier | None = None,
    allow_adopted: bool = False,
    zone: str | None = None,
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
    zone:
        The zone whose log this should be: its records must name it. With a
        ``verifier``, the signing certificate must in any case be a zone certificate
        naming the zone (and region) the log's records name, so one zone's log (or one
        signed with the SuperLink's or another party's key) does not pass for another's.

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
            scan = scan_lines(fh, p, expected_head)
    except OSError as exc:
        raise StoreError(f"cannot read audit log {p}: {exc.strerror or exc}") from None
    verdict = scan.verdict
    if not verdict.ok:
        return verdict
    named = sorted(scan.zones)
    if len({z for z, _ in named}) > 1 or (zone is not None and any(z != zone for z, _ in named)):
        listed = ", ".join(f"{z} ({r})" for z, r in named)
        return replace(verdict, ok=False, reason=f"the log's records name zone(s) {listed}, not {zone or 'one zone'}")
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
    problem = _signer_problem(signature, named, zone)
    if problem is not None:
        return replace(verdict, ok=False, reason=f"head file {hp}: {problem}", signed=signature)
    return _against_head(p, verdict, scan.adoptions, signed_raw, signature, allow_adopted=allow_adopted)


def _signer_problem(signature: HeadSignature, named: list[tuple[str, str]], zone: str | None) -> str | None:
    """Why the certificate that signed the head is not the zone whose log it is (None: it is).

    ``named``: the (zone, region) the log's records name (at most one zone); ``zone``:
    the one the auditor expects. Unchecked when no pinned certificate or CA vouches for
    the signer (``holder`` is None)."""
    holder = signature.holder
    if holder is None:
        return None
    owner = named[0] if named else None
    if owner is not None and (holder.name, holder.jurisdiction_or_region) != owner:
        return f"the log is zone {owner[0]} ({owner[1]})'s, but its head is signed with the certificate of {holder}"
    if zone is not None and holder.name != zone:
        return f"the head is signed with the certificate of {holder}, not zone {zone}'s"
    return None


def _against_head(
    path: Path,
    verdict: AuditVerdict,
    adoptions: tuple[Adoption, ...],
    signed_raw: SignedHead,
    signature: HeadSignature,
    *,
    allow_adopted: bool,
) -> AuditVerdict:
    """``verdict`` of a chain that verifies, checked against the head the zone signed:
    nothing removed, rewritten or appended after it, and adopted lines only if allowed."""
    problem = head_problem(path, signed_raw, verdict.lines)
    if problem is not None:
        first = verdict.lines + 1 if signed_raw.lines > verdict.lines else signed_raw.lines
        return replace(verdict, ok=False, first_bad_line=first, reason=problem, signed=signature)
    adopted = tuple(a for a in adoptions if a.at <= signed_raw.lines)
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


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, _FILE_MODE)
    except OSError as exc:
        raise StoreError(f"cannot open audit log {path}: {exc.strerror or exc}") from None
    return fd


def lock_path(path: Path) -> Path:
    """The lock file beside an audit log (``audit.jsonl.lock``): whoever holds it appends."""
    return path.with_name(path.name + ".lock")


def _lock(path: Path) -> FileLock:
    """Hold ``path``'s lock, or :class:`StoreError` if another process (or another
    :class:`AuditLog` of this one) holds it: two writers would interleave lines."""
    lock = FileLock(lock_path(path), timeout=0, mode=_FILE_MODE)
    try:
        lock.acquire()
    except Timeout:
        raise StoreError(f"audit log {path} is in use by another process (or another AuditLog)") from None
    except OSError as exc:
        raise StoreError(f"cannot lock audit log {path}: {exc.strerror or exc}") from None
    return lock


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
