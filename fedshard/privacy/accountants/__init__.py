"""The accountants that compose DP events into ε, one per module, behind :class:`Accountant`,
named in a registry (Opacus' pattern: ``prv``, ``rdp``).

A new accountant is one module here defining a class with the :class:`Accountant`
methods, plus its line in :data:`ACCOUNTANTS`; a federation (and each site's own config)
then names it in ``privacy.record_level.accountant``. Opacus is imported inside the
implementations: importing it takes seconds, and importing fedshard must not.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fedshard.privacy.accountants.composition import Merged
from fedshard.privacy.accountants.prv import Prv
from fedshard.privacy.accountants.rdp import Rdp
from fedshard.registry import Registry

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


ACCOUNTANTS: Registry[Accountant] = Registry("accountant", "privacy.record_level.accountant", (Prv(), Rdp()))
"""Every accountant by name: the built-in ones (a new one: its line here)."""


def register(new: Accountant) -> None:
    """Add ``new`` to :data:`ACCOUNTANTS` (before any ledger or plan names it);
    :class:`ConfigError` if another accountant has its name."""
    ACCOUNTANTS.register(new)


def accountant(name: str) -> Accountant:
    """The accountant named ``name``; :class:`ConfigError` in one line naming those that exist."""
    return ACCOUNTANTS.get_part(name)
