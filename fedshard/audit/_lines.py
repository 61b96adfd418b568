"""The audit log's line format and how a log file is scanned (see :mod:`fedshard.audit`).

One line per record, canonical JSON, the reserved keys around the fields; each line's
``hash`` chains it to the one before. :func:`scan` reads a file line by line and says
how far the chain verifies; :func:`head_problem` whether a signed head matches it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

from fedshard.audit._head import HeadSignature, SignedHead
from fedshard.integrity.canonical import canonical_json
from fedshard.integrity.chain import ChainHash, chain_link

__all__ = [
    "GENESIS",
    "RESERVED",
    "Adoption",
    "AuditVerdict",
    "Decision",
    "Scan",
    "canonical",
    "head_problem",
    "record_hash",
    "render",
    "scan",
]

GENESIS = "0" * 64
"""``prev`` of the first record."""

RESERVED = frozenset({"seq", "time", "decision", "prev", "hash"})


class Decision(StrEnum):
    """Decisions a zone records; :meth:`AuditLog.append` also takes any other non-empty string."""

    ACCEPTED = "accepted"
    REFUSED = "refused"
    FORWARDED = "forwarded"
    PUBLISHED = "published"
    SERVED = "served"
    ADOPTED = "adopted"
    """Written by the log itself on reopening: lines it found without a signed head."""
    RECONFIGURED = "reconfigured"
    """The zone took a new membership between rounds (zones, drained zones, sites)."""


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


def head_problem(path: Path, signed: SignedHead, lines: int) -> str | None:
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
    return chain_link(bytes.fromhex(body["prev"]), canonical(body), ChainHash.SHA256).hex()


def canonical(value: Any) -> bytes:
    return canonical_json(value)


def render(record: Mapping[str, Any]) -> bytes:
    """The line of a record: reserved keys around the fields, every value canonical."""
    head = ("seq", "time", "decision")
    order = [*head, *sorted(k for k in record if k not in RESERVED), "prev", "hash"]
    parts = [canonical(k) + b":" + canonical(record[k]) for k in order]
    return b"{" + b",".join(parts) + b"}"


@dataclass(frozen=True)
class Scan:
    verdict: AuditVerdict
    adoptions: tuple[Adoption, ...]
    zones: frozenset[tuple[str, str]] = frozenset()  # (zone, region) named by the verified records


def scan(fh: BinaryIO, path: Path, expected_head: str | None = None) -> Scan:
    head, count, seen = GENESIS, 0, expected_head is None
    decisions: Counter[str] = Counter()
    adoptions: list[Adoption] = []
    zones: set[tuple[str, str]] = set()
    for number, raw in enumerate(_lines(fh), start=1):
        try:
            head, record = _check_line(raw, number, head)
        except _BadLineError as bad:
            verdict = AuditVerdict(False, count, head, number, f"line {number} {bad}", decisions=dict(decisions))
            return Scan(verdict, tuple(adoptions), frozenset(zones))
        count = number
        seen = seen or head == expected_head
        decisions[record["decision"]] += 1
        if "zone" in record:
            zones.add((str(record["zone"]), str(record.get("region", ""))))
        if record["decision"] == Decision.ADOPTED:
            first, last = record.get("unsigned_from"), record.get("unsigned_to")
            if isinstance(first, int) and isinstance(last, int):
                adoptions.append(Adoption(first, last, number, str(record.get("cause", ""))))
    if not seen:
        reason = f"head {expected_head} is not in the log: lines were removed from its end"
        verdict = AuditVerdict(False, count, head, count + 1, reason, decisions=dict(decisions))
        return Scan(verdict, tuple(adoptions), frozenset(zones))
    return Scan(AuditVerdict(True, count, head, decisions=dict(decisions)), tuple(adoptions), frozenset(zones))


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
    if render(record) != raw[:-1]:
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
