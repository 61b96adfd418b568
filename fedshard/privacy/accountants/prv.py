"""``prv`` (default): numerical composition of privacy loss random variables (Gopi et al.
2021), from Opacus; tight, but slow: a call costs ~0.5 s for 200 steps, ~6 s for 10⁵
steps, and time grows with the number of *distinct* history entries (which is why events
are merged before they get here)."""

from __future__ import annotations

from fedshard.privacy.accountants.composition import Merged
from fedshard.privacy.accountants.rdp import rdp_epsilon

__all__ = ["Prv"]


class Prv:
    """Privacy loss random variable accounting."""

    name = "prv"
    opacus_name: str | None = "prv"

    def epsilon(self, merged: Merged, delta: float) -> float:
        """ε of ``merged`` at ``delta``; where PRV's grid for so small a σ does not fit in
        memory, RDP's bound (looser, but valid)."""
        from opacus.accountants import PRVAccountant  # type: ignore[import-untyped]

        accountant = PRVAccountant()
        accountant.history = list(merged)
        try:
            return float(accountant.get_epsilon(delta=delta))
        except MemoryError:
            return rdp_epsilon(merged, delta)
