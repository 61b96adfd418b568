"""Server-side optimisers applied to the published aggregate (post-processing).

A zone publishes the weighted mean update Δ of a round; every site applies it to its
own on-prem parameters with the same rule, so every site keeps the same model:

* ``avg``       θ ← θ + η Δ                                          (FedAvg; η = 1)
* ``momentum``  m ← β₁ m + Δ;  θ ← θ + η m                          (FedAvgM)
* ``adam``      m ← β₁ m + (1-β₁) Δ;  v ← β₂ v + (1-β₂) Δ²;
                θ ← θ + η m / (√v + τ)                                (FedAdam, Reddi et al. 2021)

Only the aggregate is used, so with DP on these rules are post-processing and cost no
privacy. The arithmetic is element-wise IEEE float32 in a fixed order, so every site
computes the same bits.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

__all__ = ["ServerOptimizer", "ServerOptimizerKind"]


class ServerOptimizerKind(StrEnum):
    """The rule sites use to apply an aggregate."""

    AVG = "avg"
    MOMENTUM = "momentum"
    ADAM = "adam"


@dataclass(frozen=True, slots=True)
class ServerOptimizer:
    """A server-side optimiser; its state (``m:…``, ``v:…`` per shard) lives with the parameters."""

    kind: ServerOptimizerKind = ServerOptimizerKind.AVG
    learning_rate: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def describe(self) -> str:
        """Canonical text of the rule (sites refuse to switch rules mid-federation)."""
        return f"{self.kind.value}:lr={self.learning_rate!r},b1={self.beta1!r},b2={self.beta2!r},tau={self.tau!r}"

    def apply(
        self,
        params: MutableMapping[str, np.ndarray],
        delta: Mapping[str, np.ndarray],
        state: MutableMapping[str, np.ndarray],
    ) -> None:
        """Apply the aggregate ``delta`` to ``params`` in place, updating ``state``."""
        for shard_id, d in delta.items():
            theta = params[shard_id]
            d = d.astype(theta.dtype, copy=False)
            dtype = theta.dtype.type
            if self.kind is ServerOptimizerKind.AVG:
                step = d * dtype(self.learning_rate)
            elif self.kind is ServerOptimizerKind.MOMENTUM:
                m = state.get(f"m:{shard_id}", np.zeros_like(theta)) * dtype(self.beta1) + d
                state[f"m:{shard_id}"] = m
                step = m * dtype(self.learning_rate)
            else:
                m = state.get(f"m:{shard_id}", np.zeros_like(theta)) * dtype(self.beta1) + d * dtype(1 - self.beta1)
                v = state.get(f"v:{shard_id}", np.zeros_like(theta)) * dtype(self.beta2) + np.square(d) * dtype(
                    1 - self.beta2
                )
                state[f"m:{shard_id}"], state[f"v:{shard_id}"] = m, v
                step = m / (np.sqrt(v) + dtype(self.tau)) * dtype(self.learning_rate)
            params[shard_id] = theta + step
