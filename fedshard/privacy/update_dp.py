"""Update-level DP: clip a site's whole released update to an L2 bound and add
Gaussian noise, before it is cut into gradient shards.

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
from fedshard.privacy.secure_noise import SecureGaussian

__all__ = ["clip_and_noise", "update_event"]


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
