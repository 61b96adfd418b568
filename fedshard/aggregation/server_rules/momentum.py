"""``momentum``: m ← β₁ m + Δ; θ ← θ + η m (FedAvgM)."""

from __future__ import annotations

import numpy as np

from fedshard.aggregation.server_rules._slots import Hyper, Slots

__all__ = ["Momentum"]


class Momentum:
    """FedAvgM's rule."""

    name = "momentum"

    def step(self, delta: np.ndarray, slots: Slots, hyper: Hyper) -> np.ndarray:
        """η (β₁ m + Δ), keeping the new m."""
        m = slots.get("m") * hyper.beta1 + delta
        slots.set("m", m)
        step: np.ndarray = m * hyper.learning_rate
        return step
