"""What a server rule reads and writes for one shard: its optimiser state (``m``, ``v``…,
kept with the site's parameters as ``m:<shard>``) and the federation's hyper-parameters."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

import numpy as np

__all__ = ["Hyper", "Slots"]


@dataclass(frozen=True, slots=True)
class Hyper:
    """The federation's hyper-parameters, as scalars of the parameters' dtype (so float32
    parameters are stepped in float32 arithmetic, the same bits at every site)."""

    learning_rate: np.floating
    beta1: np.floating
    beta2: np.floating
    tau: np.floating
    one_minus_beta1: np.floating  # 1 - β₁ computed in float64, then cast (not 1 - β₁ in the dtype)
    one_minus_beta2: np.floating


@dataclass(frozen=True, slots=True)
class Slots:
    """One shard's optimiser state: named arrays shaped like its parameters (zeros when new)."""

    state: MutableMapping[str, np.ndarray]
    shard_id: str
    like: np.ndarray

    def get(self, slot: str) -> np.ndarray:
        """The slot's array (zeros like the parameters when the shard has none yet)."""
        return self.state.get(f"{slot}:{self.shard_id}", np.zeros_like(self.like))

    def set(self, slot: str, value: np.ndarray) -> None:
        """Keep ``value`` as the slot's array."""
        self.state[f"{slot}:{self.shard_id}"] = value
