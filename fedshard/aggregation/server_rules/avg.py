"""``avg``: θ ← θ + η Δ (FedAvg; η = 1 applies the weighted mean as it is)."""

from __future__ import annotations

import numpy as np

from fedshard.aggregation.server_rules._slots import Hyper, Slots

__all__ = ["Avg"]


class Avg:
    """FedAvg's rule."""

    name = "avg"

    def step(self, delta: np.ndarray, slots: Slots, hyper: Hyper) -> np.ndarray:
        """η Δ."""
        step: np.ndarray = delta * hyper.learning_rate
        return step
