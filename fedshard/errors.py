"""The one exception tree of fedshard.

Every error a user can cause derives from :class:`FedshardError` and from the
builtin exception that matches it, so callers can catch either::

    FedshardError
    ├── ConfigError(ValueError)              invalid YAML, unknown key, bad value
    ├── TaskError(RuntimeError)              a task plug-in cannot be loaded or misbehaves
    ├── ShardError(ValueError)               a shard does not fit the shard plan
    ├── IntegrityError(ValueError)           digest, Merkle root or model version mismatch
    ├── ZoneError(RuntimeError)              a zone refused or failed a request
    │   ├── PushRejectedError                a pushed update was refused (nothing counted)
    │   └── AggregateNotFoundError(LookupError)  no published aggregate for that round
    ├── RoundError(RuntimeError)             a round cannot proceed (too few sites, timeouts)
    ├── PrivacyError(RuntimeError)           differential privacy cannot be applied as configured
    │   └── BudgetExhaustedError(PermissionError)  the round would overrun the site's (ε, δ) budget
    ├── ResidencyViolationError(PermissionError)  a shard may not go to, or be held in, the zone asked
    ├── StoreError(OSError)                  the on-prem store (or privacy ledger) is missing or corrupt
    │   ├── ShardIntegrityError(IntegrityError)  a stored shard was tampered with, swapped, rolled back or truncated
    │   ├── ShardNotFoundError(LookupError)  the store holds no shard of that id
    │   └── StoreKeyError(PermissionError)   the store's key-encryption key is missing, wrong or retired
    └── PkiError(PermissionError)            a certificate or key is missing, invalid, untrusted or expired

Messages name the bad value and say how to fix it; they are one line, because the
CLI prints ``str(error)`` and nothing else.
"""

from __future__ import annotations

__all__ = [
    "AggregateNotFoundError",
    "BudgetExhaustedError",
    "ConfigError",
    "DeployError",
    "FedshardError",
    "IntegrityError",
    "PkiError",
    "PrivacyError",
    "PushRejectedError",
    "ResidencyViolationError",
    "RoundError",
    "ShardError",
    "ShardIntegrityError",
    "ShardNotFoundError",
    "StoreError",
    "StoreKeyError",
    "TaskError",
    "ZoneError",
]


class FedshardError(Exception):
    """Root of every error fedshard raises on purpose."""


class ConfigError(FedshardError, ValueError):
    """A configuration file or value is invalid."""


class TaskError(FedshardError, RuntimeError):
    """A task plug-in cannot be loaded or does not follow the Task protocol."""


class ShardError(FedshardError, ValueError):
    """A shard or update does not fit the shard plan."""


class IntegrityError(FedshardError, ValueError):
    """A digest, Merkle root or model version does not match what was expected."""


class ZoneError(FedshardError, RuntimeError):
    """A zone aggregator refused or failed a request."""


class PushRejectedError(ZoneError):
    """A zone refused a pushed update; nothing from the push was counted.

    Parameters
    ----------
    reason:
        One-line reason given by the zone.
    code:
        Short machine-readable code (e.g. ``"digest"``, ``"shape"``, ``"round"``).
    """

    def __init__(self, reason: str, code: str = "rejected") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class AggregateNotFoundError(ZoneError, LookupError):
    """A zone has no published aggregate for the requested round."""


class RoundError(FedshardError, RuntimeError):
    """A round cannot proceed (too few sites answered, version disagreement, ...)."""


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
