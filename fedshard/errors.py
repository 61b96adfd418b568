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
    └── PkiError(PermissionError)            a certificate or key is missing, invalid, untrusted or expired

Messages name the bad value and say how to fix it; they are one line, because the
CLI prints ``str(error)`` and nothing else.
"""

from __future__ import annotations

__all__ = [
    "AggregateNotFoundError",
    "BudgetExhaustedError",
    "ConfigError",
    "FedshardError",
    "IntegrityError",
    "PkiError",
    "PrivacyError",
    "PushRejectedError",
    "ResidencyViolationError",
    "RoundError",
    "ShardError",
    "StoreError",
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


class StoreError(FedshardError, OSError):
    """The on-prem store is missing, unreadable or corrupt."""


class PkiError(FedshardError, PermissionError):
    """A certificate or key is missing, invalid, not issued by the federation CA, or expired."""
