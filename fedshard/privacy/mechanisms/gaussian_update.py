"""Update-level DP: clip a site's whole released update to an L2 bound and add
Gaussian noise, before it is cut into gradient shards (mechanism ``gaussian``).

One release per round is one Gaussian mechanism with sensitivity ``clip_norm`` and
noise ``σ · clip_norm``; the ledger records it as an event with sample rate 1 (a site
cannot count on being sampled by the coordinator: that is the coordinator's choice).
The noise comes from a cryptographically secure source keyed by the operating system
(:class:`~fedshard.privacy.secure_noise.SecureGaussian`), never from the federation's seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedshard.privacy.events import DPEvent, Guarantee
from fedshard.privacy.mechanisms._shares import RoundShape, Sharing
from fedshard.privacy.secure_noise import SecureGaussian

__all__ = ["GaussianUpdate", "UpdateNoise", "clip_and_noise", "update_event"]


def update_event(noise_multiplier: float) -> DPEvent:
    """The DP event of one update-level release."""
    return DPEvent(Guarantee.UPDATE, noise_multiplier, 1.0, 1)


def clip_and_noise(
    update: Mapping[str, np.ndarray],
    clip_norm: float,
    noise_multiplier: float,
    rng: np.random.Generator | None = None,
) -> tuple[dict[str, np.ndarray], float]:
    """Clip ``update`` (all tensors together) to L2 norm ``clip_norm``, add N(0, (σ·C)²).

    Returns the noised update (same dtypes) and the update's norm before clipping.
    ``rng`` is for tests only (reproducible noise); by default the noise is
    :class:`~fedshard.privacy.secure_noise.SecureGaussian`'s.
    """
    source = SecureGaussian() if rng is None else None
    norm = math.sqrt(sum(float(np.square(v, dtype=np.float64).sum()) for v in update.values()))
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    std = noise_multiplier * clip_norm
    noised: dict[str, np.ndarray] = {}
    for name, values in update.items():
        noise = (
            source.normal(std, values.size).reshape(values.shape)
            if source is not None
            else rng.normal(0.0, std, size=values.shape)  # type: ignore[union-attr]
        )
        noised[name] = (values.astype(np.float64) * scale + noise).astype(values.dtype)
    return noised, norm


class UpdateNoise:
    """One round of update-level DP: the released update clipped to ``clip`` and noised
    with ``added`` × ``clip`` (the σ this site adds itself)."""

    training = None

    def __init__(self, clip: float, added: float) -> None:
        self.clip, self.added = clip, added

    def verify(self) -> None:
        """Nothing to check: the noise is added at release."""

    def release(self, update: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``update`` clipped and noised (:func:`clip_and_noise`)."""
        out, _ = clip_and_noise(update, self.clip, self.added)
        return out


class GaussianUpdate:
    """The Gaussian mechanism on a site's whole update: one event of sample rate 1 per round."""

    name = "gaussian"
    guarantee = Guarantee.UPDATE

    def event(self, shape: RoundShape, noise_multiplier: float) -> DPEvent:
        """:func:`update_event` (the round's shape does not matter: one release per round)."""
        return update_event(noise_multiplier)

    def start(self, planned: DPEvent, clip: float, sharing: Sharing) -> UpdateNoise:
        """The round's noise: with distributed noise (HE on every shard) each site adds its
        share σ/√(n−1); the aggregate weighs each update by its site's weight, and one
        site's update can move it by its weight × ``clip``, so each site scales its share by
        the round's largest weight over its own (≥ 1), and every share counts as much as
        the most-weighted site's influence."""
        ratio = max(1.0, sharing.largest_weight / sharing.weight)
        share = sharing.share() * ratio if sharing.distributed else 1.0
        return UpdateNoise(clip, planned.noise_multiplier * share)
