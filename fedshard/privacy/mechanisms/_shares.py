"""What a round looks like to a mechanism: its shape (records, batch, epochs), and how the
noise is shared when several sites each add part of it under HE.

The share maths: every site decrypts the aggregate and knows its own share, so what
protects another site's records is the other ``n − 1`` shares. Each site adds σ/√(n − 1):
the decrypted aggregate of ``n`` shares carries σ·√(n/(n − 1)), and any one site's view of
it, once it subtracts its own share, still carries σ, the noise every ledger accounts.

That holds only if every share was made under the same terms: a site sent a larger σ (or a
smaller clip, another rate or learning rate) than the others accounts a σ their shares do
not add up to. Each site names its terms in its signed manifests (:func:`shared_terms`), and
a zone puts only shares of one set of terms in an aggregate, the set most of its sites named
(:meth:`fedshard.zone._state.OpenRound.settle`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RoundShape", "Sharing", "noise_share", "shared_terms"]


def noise_share(distributed_over: int | None) -> float:
    """The fraction of σ each site adds when the noise is distributed over ``n`` sites'
    shares: 1/√(n − 1); without distribution (``None``) a site adds all of σ."""
    return 1.0 / math.sqrt(distributed_over - 1) if distributed_over else 1.0


@dataclass(frozen=True)
class RoundShape:
    """One round's local training, which what a record-level round costs depends on."""

    num_examples: int
    """The site's training records."""
    batch_size: int
    epochs: int
    sample_rate: float | None = None
    """Each round one DP-SGD step over a Poisson sample of the records at this rate (the plan's
    ``record.sample_rate``); None: whole epochs of batches of ``batch_size``."""


@dataclass(frozen=True)
class Sharing:
    """How a site's noise is shared in one round, and what the aggregate weighs it by.

    ``weight`` is the site's aggregation weight in the round (the coordinator's, which the
    zones check), ``largest_weight`` the round's largest (the HE weight scale): a site's
    share must cover its own influence on the weighted sum, so mechanisms scale it by
    their ratio (see each mechanism's ``start``).
    """

    distributed_over: int | None
    examples: int
    weight: float
    largest_weight: float

    @property
    def distributed(self) -> bool:
        """Whether the noise is shared at all."""
        return self.distributed_over is not None

    def share(self) -> float:
        """The fraction of σ this site adds before any weight scaling (1 when not shared)."""
        return noise_share(self.distributed_over)


def shared_terms(
    level: str, mechanism: str, noise_multiplier: float, clip: float, distributed_over: int, sample_rate: float
) -> str:
    """What a site's noise share of one guarantee (``level``) was made under, as its manifests
    name it: the mechanism, σ, clip, sharing and sample rate. Sites that run the same terms
    name the same string, whatever their records or weights (each scales its share to those,
    see :class:`Sharing`); floats are written exactly (``repr``)."""
    return f"{level} {mechanism} sigma={noise_multiplier!r} clip={clip!r} n={distributed_over} q={sample_rate!r}"
