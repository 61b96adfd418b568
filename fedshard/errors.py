"""The one exception tree of fedshard.

Every error a user can cause derives from :class:`FedshardError` and from the
builtin exception that matches it, so callers can catch either::

    FedshardError
    ├── ConfigError(ValueError)              invalid YAML, unknown key, bad value
    ├── TaskError(RuntimeError)              a task plug-in cannot be loaded or misbehaves
    ├── ShardError(ValueError)               a shard does not fit the shard plan
    ├── IntegrityError(ValueError)           digest, Merkle root or model version mismatch
    │   └── FrameError                       a chunk stream breaks what its header declared
    ├── ZoneError(RuntimeError)              a zone refused or failed a request
    │   ├── PushRejectedError                a pushed update was refused (nothing counted)
    │   ├── ZoneUnavailableError(ConnectionError)  no answer: the zone is down or the call broke off (retry)
    │   └── AggregateNotFoundError(LookupError)  no published aggregate for that round
    ├── RoundError(RuntimeError)             a round cannot proceed (too few sites, timeouts)
    │   └── RoundAbortedError                a zone failed or aborted the round; the next one may run
    ├── PrivacyError(RuntimeError)           differential privacy cannot be applied as configured
    │   └── BudgetExhaustedError(PermissionError)  the round would overrun the site's (ε, δ) budget
    ├── ResidencyViolationError(PermissionError)  a shard may not go to, or be held in, the zone asked
    ├── StoreError(OSError)                  the on-prem store (or privacy ledger) is missing or corrupt
    │   ├── ShardIntegrityError(IntegrityError)  a stored shard was tampered with, swapped, rolled back or truncated
    │   ├── ShardNotFoundError(LookupError)  the store holds no shard of that id
    │   └── StoreKeyError(PermissionError)   the store's key-encryption key is missing, wrong or retired
    └── PkiError(PermissionError)            a certificate or key is missing, invalid, untrusted or expired
        └── PeerIdentityError                the party at an endpoint is not the one expected there (nothing sent)

Messages name the bad value and say how to fix it; they are one line, because the
CLI prints ``str(error)`` and nothing else. An error a zone sends over the wire also
carries a :class:`RefusalCode` in ``error.code``, for programs; the gRPC client raises
the same class with the same code as the zone did (see :mod:`fedshard.protocol.codes`).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "AggregateNotFoundError",
    "BudgetExhaustedError",
    "ConfigError",
    "DeployError",
    "FedshardError",
    "FrameError",
    "HeldPush",
    "IntegrityError",
    "PeerIdentityError",
    "PkiError",
    "PrivacyError",
    "PushRejectedError",
    "RefusalCode",
    "ResidencyViolationError",
    "RoundAbortedError",
    "RoundError",
    "ShardError",
    "ShardIntegrityError",
    "ShardNotFoundError",
    "StoreError",
    "StoreKeyError",
    "TaskError",
    "ZoneError",
    "ZoneUnavailableError",
]


class RefusalCode(StrEnum):
    """Why a zone refused a request: the closed set of codes that cross the wire.

    Codes are stable: a code never changes meaning, and a client that meets a code it
    does not know treats it as :attr:`REJECTED`. Each code says which error a client
    raises (:func:`fedshard.protocol.codes.error_for`) and which gRPC status carries it.
    """

    # a push or forward refused from its header, before any frame
    ROUND = "round"
    """The round is not open at the zone (closed, aborted, never opened)."""
    TOKEN = "token"
    """The round token does not match (a stale or replayed push)."""
    SITE = "site"
    """The site was not selected for the round."""
    DUPLICATE = "duplicate"
    """The site (or zone) already pushed in this round, or a shard came twice."""
    PLAN = "plan"
    """The manifest's shard plan is not the round's."""
    VERSION = "version"
    """The update was computed from another model version than the round expects."""
    ZONE = "zone"
    """The manifest is addressed to another zone."""
    UNKNOWN_SHARD = "unknown-shard"
    """A shard is not in the round's plan, or not listed in the header."""
    MALFORMED = "malformed"
    """A header (manifest, partial-sum header) does not parse."""
    FORMAT = "format"
    """A header is of a format or digest hash this zone does not speak (another fedshard release)."""
    PROTOCOL = "protocol"
    """Frames out of order: no header first, a header twice."""
    # frames
    SHAPE = "shape"
    """A shard's shape or byte count differs from what the plan or header declares."""
    DTYPE = "dtype"
    """A shard's dtype label differs from the plan's (or says ciphertext where it is not)."""
    OFFSET = "offset"
    """A chunk is not where the shard's bytes so far end."""
    TRUNCATED = "truncated"
    """A shard ended before its declared size."""
    MISSING = "missing"
    """A shard the header lists never arrived."""
    DIGEST = "digest"
    """A shard's digest differs from the header's."""
    NON_FINITE = "non-finite"
    """A shard holds NaN or infinite values (or a non-positive weight)."""
    STATE = "state"
    """The push is already over (committed or refused)."""
    # who sends, and residency
    IDENTITY = "identity"
    """The caller's certificate does not name who the request says, or the party is unknown."""
    SIGNATURE = "signature"
    """The manifest is not signed by the site's registered key."""
    POLICY = "policy"
    """The site routed by another residency policy than the zone enforces."""
    CLASS = "class"
    """A shard's class in the manifest differs from the federation's classification."""
    ENCRYPTION = "encryption"
    """A shard is encrypted where policy says clear, or the reverse, or is not this federation's ciphertext."""
    RESIDENCY = "residency"
    """The policy does not let this zone's region hold the shard, or aggregate it here."""
    MEMBER = "member"
    """The caller's certificate names a party that is not a member of the federation."""
    AUTHORITY = "authority"
    """The caller's role may not make this call (a round lifecycle call from a site, a forward
    from a site or to a zone that does not reduce)."""
    WEIGHT = "weight"
    """The manifest's weight (or a partial sum's) differs from what the round fixed for it."""
    BOUND = "bound"
    """Values, a partial sum or an update's norm are outside the federation's bounds."""
    REJECTED = "rejected"
    """A refusal without a more precise code."""
    # not refusals of a push
    BUSY = "busy"
    """The zone's staging budget stayed full; retry later."""
    LIMIT = "limit"
    """The caller already holds as many concurrent streams as the zone allows one party."""
    IDLE = "idle"
    """A stream sent nothing for too long, or ran past its deadline; the zone ended it."""
    NOT_FOUND = "not-found"
    """No published aggregate of that round and group."""
    NOT_SERVED = "not-served"
    """The policy does not let the asking site receive that aggregate."""
    LIFECYCLE = "lifecycle"
    """A round lifecycle call the round's state does not allow (open twice, close an unknown round)."""
    PRIVACY = "privacy"
    """Publishing would break a privacy guarantee (too few sites' noise shares)."""
    CORRUPT = "corrupt"
    """Something the zone stored fails its checks."""
    INVALID = "invalid"
    """A lifecycle request whose content is invalid (a shard plan that does not parse)."""
    FAILED = "failed"
    """The zone could not do what was asked (e.g. forwarding to the reducing zone failed)."""

    @classmethod
    def parse(cls, text: str) -> RefusalCode:
        """The code named ``text``; :attr:`REJECTED` for a code this version does not know."""
        try:
            return cls(text)
        except ValueError:
            return cls.REJECTED


class FedshardError(Exception):
    """Root of every error fedshard raises on purpose.

    Parameters
    ----------
    args:
        The one-line message (as for :class:`Exception`).
    code:
        Why a zone refused, where the error crosses the wire; None elsewhere.
    """

    code: RefusalCode | None = None

    def __init__(self, *args: object, code: RefusalCode | None = None) -> None:
        super().__init__(*args)
        if code is not None:
            self.code = code


class ConfigError(FedshardError, ValueError):
    """A configuration file or value is invalid."""


class TaskError(FedshardError, RuntimeError):
    """A task plug-in cannot be loaded or does not follow the Task protocol."""


class ShardError(FedshardError, ValueError):
    """A shard or update does not fit the shard plan."""


class IntegrityError(FedshardError, ValueError):
    """A digest, Merkle root or model version does not match what was expected."""


class FrameError(IntegrityError):
    """A stream of shard chunks breaks what its header declared: an offset, a size, a
    dtype or shape label, a digest, a shard missing, unlisted or sent twice.

    Parameters
    ----------
    reason:
        One line naming the shard and what is wrong.
    code:
        Which check failed (:attr:`RefusalCode.OFFSET`, :attr:`RefusalCode.DIGEST`, …).
    """

    code: RefusalCode

    def __init__(self, reason: str, code: RefusalCode) -> None:
        super().__init__(reason, code=code)
        self.reason = reason


class ZoneError(FedshardError, RuntimeError):
    """A zone aggregator refused or failed a request.

    Parameters
    ----------
    reason:
        One-line reason given by the zone.
    code:
        Why (default: the class's :attr:`default_code`).
    """

    default_code = RefusalCode.FAILED
    code: RefusalCode

    def __init__(self, reason: str, code: RefusalCode | None = None) -> None:
        super().__init__(reason, code=code or self.default_code)
        self.reason = reason


class HeldPush(StrEnum):
    """What a zone holds of the very manifest (same digest) it refused as a duplicate."""

    COUNTED = "counted"
    """Counted: an earlier attempt of this push landed (a retry may treat it as success)."""
    PENDING = "pending"
    """Still arriving or being folded on an earlier stream (ask again later)."""


class PushRejectedError(ZoneError):
    """A zone refused a pushed update (or forwarded partial sums); nothing of it was counted.

    ``code`` says why: :attr:`RefusalCode.DIGEST`, :attr:`RefusalCode.SHAPE`, … .
    With code :attr:`RefusalCode.DUPLICATE`, ``held`` says what the zone holds of the
    same manifest (None: another manifest of the site, or nothing the zone could match).
    """

    default_code = RefusalCode.REJECTED
    held: HeldPush | None = None


class ZoneUnavailableError(ZoneError, ConnectionError):
    """No answer from a zone: it is down, restarting or unreachable, or the call broke off
    or ran out of time before the zone replied. Not a refusal: retrying may succeed."""


class AggregateNotFoundError(ZoneError, LookupError):
    """A zone has no published aggregate for the requested round."""

    default_code = RefusalCode.NOT_FOUND


class RoundError(FedshardError, RuntimeError):
    """A round cannot proceed (too few sites answered, version disagreement, ...)."""


class RoundAbortedError(RoundError):
    """A zone failed or aborted the round (crashed, lost its state, refused to close it).

    The round is lost, not the federation: the coordinator aborts it at every zone, logs
    it, and runs the next round (up to a small limit of consecutive aborted rounds).
    Nothing of the lost round is applied at any site; ledgers count what they reserved.

    Parameters
    ----------
    reason:
        One line naming the round, the zone and what went wrong.
    zone:
        The zone whose failure aborted the round, where known.
    """

    def __init__(self, reason: str, zone: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.zone = zone


class PrivacyError(FedshardError, RuntimeError):
    """Differential privacy cannot be applied as configured (incompatible layers, ...)."""


class BudgetExhaustedError(PrivacyError, PermissionError):
    """Releasing this round would overrun the site's privacy budget; nothing was released."""


class ResidencyViolationError(FedshardError, PermissionError):
    """Residency policy forbids sending a shard to, or holding it in, the zone or region asked."""


class DeployError(FedshardError, RuntimeError):
    """A deployment step failed: a SuperLink, SuperNode or zone process, or a ``flwr`` call."""


class StoreError(FedshardError, OSError):
    """The on-prem store is missing, unreadable or corrupt."""


class PkiError(FedshardError, PermissionError):
    """A certificate or key is missing, invalid, not issued by the federation CA, or expired."""


class PeerIdentityError(PkiError):
    """The server at an endpoint holds a certificate of another party than the one the caller's
    own config expects there (another zone, region or role): the TLS handshake failed and
    nothing was sent. Not retried: the message names who was expected and who answered."""


class ShardIntegrityError(StoreError, IntegrityError):
    """A stored shard failed its checks on read (tampered, swapped, rolled back or truncated).

    Parameters
    ----------
    shard_id:
        The shard whose stored copy is bad; the rest of the store is unaffected.
    reason:
        One-line description, naming the shard and what is wrong.
    """

    def __init__(self, shard_id: str, reason: str) -> None:
        super().__init__(reason)
        self.shard_id = shard_id
        self.reason = reason


class ShardNotFoundError(StoreError, LookupError):
    """The store holds no shard of the requested id."""


class StoreKeyError(StoreError, PermissionError):
    """The store's key-encryption key is missing, not the store's, or retired by a rotation."""
