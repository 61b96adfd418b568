"""The accountants that compose DP events into ε, one per module, behind :class:`Accountant`,
named in a registry (Opacus' pattern: ``prv``, ``rdp``).

A new accountant is one module here defining a class with the :class:`Accountant`
methods, plus its line in :data:`ACCOUNTANTS`; a federation (and each site's own config)
then names it in ``privacy.record_level.accountant``. Opacus is imported inside the
implementations: importing it takes seconds, and importing fedshard must not.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Protocol, runtime_checkable

from fedshard.errors import ConfigError
from fedshard.privacy.accountants.composition import Merged
from fedshard.privacy.accountants.prv import Prv
from fedshard.privacy.accountants.rdp import Rdp

__all__ = ["ACCOUNTANTS", "Accountant", "Merged", "accountant", "register"]


@runtime_checkable
class Accountant(Protocol):
    """ε of a composition of subsampled Gaussian steps."""

    name: str
    """What configs and privacy plans name it by."""

    opacus_name: str | None
    """The name Opacus' noise calibration knows it by (None: fedshard calibrates by bisection)."""

    def epsilon(self, merged: Merged, delta: float) -> float:
        """ε at ``delta`` of ``merged`` (sorted distinct ``(σ, q, steps)``): an upper bound;
        ``inf`` where it finds none. May raise ArithmeticError, ValueError, RuntimeError or
        MemoryError, which the caller turns into a :class:`~fedshard.errors.PrivacyError`."""
        ...


ACCOUNTANTS: MutableMapping[str, Accountant] = {a.name: a for a in (Prv(), Rdp())}
"""Every accountant by name: the built-in ones (a new one: its line here)."""


def register(new: Accountant) -> None:
    """Add ``new`` to :data:`ACCOUNTANTS` (before any ledger or plan names it).

    Raises
    ------
    ConfigError
        An accountant of that name is already registered.
    """
    if new.name in ACCOUNTANTS and ACCOUNTANTS[new.name] is not new:
        raise ConfigError(f"an accountant named {new.name!r} is already registered")
    ACCOUNTANTS[new.name] = new


def accountant(name: str) -> Accountant:
    """The accountant named ``name``.

    Raises
    ------
    ConfigError
        One line naming the accountants that exist.
    """
    try:
        return ACCOUNTANTS[name]
    except KeyError:
        known = ", ".join(sorted(ACCOUNTANTS))
        raise ConfigError(f"privacy.record_level.accountant {name!r}: no such accountant ({known})") from None
