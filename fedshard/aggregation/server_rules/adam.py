"""``adam``: m ← β₁ m + (1-β₁) Δ; v ← β₂ v + (1-β₂) Δ²; θ ← θ + η m / (√v + τ)
(FedAdam, Reddi et al. 2021)."""

from __future__ import annotations

import numpy as np

from fedshard.aggregation.server_rules._slots import Hyper, Slots

__all__ = ["Adam"]


class Adam:
    """FedAdam's rule."""

    name = "adam"

    def step(self, delta: np.ndarray, slots: Slots, hyper: Hyper) -> np.ndarray:
        """η m / (√v + τ), keeping the new m and v."""
        m = slots.get("m") * hyper.beta1 + delta * hyper.one_minus_beta1
        v = slots.get("v") * hyper.beta2 + np.square(delta) * hyper.one_minus_beta2
        slots.set("m", m)
        slots.set("v", v)
        step: np.ndarray = m / (np.sqrt(v) + hyper.tau) * hyper.learning_rate
        return step
