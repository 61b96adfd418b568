"""Refusals across the wire: a typed code plus one line of reason.

A zone refuses with a :class:`~fedshard.errors.FedshardError` that carries a
:class:`~fedshard.errors.RefusalCode` (``error.code``). A transport carries that code
and the one-line reason; the receiving side rebuilds the same error class with the
same code (:func:`error_for`), so a site and its user see the zone's own words
("zone eu-central refused site-a's push for round 3: shard fc1.weight#r0c0: digest
does not match the manifest") and a program can branch on ``error.code``. The gRPC
transport also picks its status from the code, by a table
(:mod:`fedshard.zone.rpc._status`).
"""

from __future__ import annotations

from types import MappingProxyType

from fedshard.errors import (
    AggregateNotFoundError,
    ConfigError,
    FedshardError,
    IntegrityError,
    PushRejectedError,
    RefusalCode,
    ResidencyViolationError,
    ShardError,
    StoreError,
    ZoneError,
)

__all__ = ["MAX_REASON_CHARS", "RefusalCode", "error_for", "one_line", "refusal_code"]

MAX_REASON_CHARS = 1000
"""Longest reason a zone sends (longer ones are cut, with an ellipsis)."""

_ERROR_CLASS: MappingProxyType[RefusalCode, type[FedshardError]] = MappingProxyType(
    {
        RefusalCode.BUSY: ZoneError,
        RefusalCode.LIMIT: ZoneError,
        RefusalCode.IDLE: ZoneError,
        RefusalCode.LIFECYCLE: ZoneError,
        RefusalCode.PRIVACY: ZoneError,
        RefusalCode.INVALID: ZoneError,
        RefusalCode.FAILED: ZoneError,
        RefusalCode.NOT_FOUND: AggregateNotFoundError,
        RefusalCode.NOT_SERVED: ResidencyViolationError,
        RefusalCode.CORRUPT: IntegrityError,
    }
)
"""Codes that are not refusals of a pushed update, and the error each one raises;
every other code raises :class:`PushRejectedError`."""


def refusal_code(error: FedshardError) -> RefusalCode:
    """The code ``error`` crosses the wire with: its own, else one by its class.

    An error without a code is classed: a residency refusal to serve an aggregate
    (:attr:`~RefusalCode.NOT_SERVED`), a damaged file of the zone's
    (:attr:`~RefusalCode.CORRUPT`), a header that does not parse
    (:attr:`~RefusalCode.MALFORMED`), a request whose content is invalid
    (:attr:`~RefusalCode.INVALID`), anything else (:attr:`~RefusalCode.FAILED`).
    """
    if error.code is not None:
        return error.code
    if isinstance(error, StoreError):
        return RefusalCode.CORRUPT
    if isinstance(error, ResidencyViolationError):
        return RefusalCode.NOT_SERVED
    if isinstance(error, IntegrityError):
        return RefusalCode.MALFORMED
    if isinstance(error, ShardError | ConfigError):
        return RefusalCode.INVALID
    return RefusalCode.FAILED


def error_for(code: RefusalCode, reason: str) -> FedshardError:
    """The error a refusal with ``code`` and ``reason`` raises on the receiving side.

    Returns
    -------
    FedshardError
        :class:`PushRejectedError` for refusals of a push or forward,
        :class:`AggregateNotFoundError`, :class:`ResidencyViolationError`,
        :class:`IntegrityError` or :class:`ZoneError` for the others; ``code`` attached.
    """
    cls = _ERROR_CLASS.get(code, PushRejectedError)
    if issubclass(cls, ZoneError):
        return cls(reason, code)
    return cls(reason, code=code)


def one_line(text: str) -> str:
    """``text`` as one line of at most :data:`MAX_REASON_CHARS` characters."""
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    if len(line) > MAX_REASON_CHARS:
        line = line[: MAX_REASON_CHARS - 1] + "…"
    return line
