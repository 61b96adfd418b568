"""The server-side optimiser a federation applies its aggregates with: the rule
(:mod:`fedshard.aggregation.server_rules`, by name) and its hyper-parameters.

A zone publishes the weighted mean update Δ of a round; every site applies it to its
own on-prem parameters with the same rule, so every site keeps the same model. Only the
aggregate is used, so with DP on this is post-processing and costs no privacy. The
arithmetic is element-wise IEEE float32 in a fixed order, so every site computes the
same bits.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import numpy as np

from fedshard.aggregation.server_rules import Hyper, Slots, rule

__all__ = ["ServerOptimizer"]


@dataclass(frozen=True, slots=True)
class ServerOptimizer:
    """A server-side optimiser; its state (``m:…``, ``v:…`` per shard) lives with the parameters."""

    kind: str = "avg"
    learning_rate: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def describe(self) -> str:
        """Canonical text of the rule (sites refuse to switch rules mid-federation)."""
        return f"{self.kind}:lr={self.learning_rate!r},b1={self.beta1!r},b2={self.beta2!r},tau={self.tau!r}"

    def apply(
        self,
        params: MutableMapping[str, np.ndarray],
        delta: Mapping[str, np.ndarray],
        state: MutableMapping[str, np.ndarray],
    ) -> None:
        """Apply the aggregate ``delta`` to ``params`` in place, updating ``state``.

        Raises
        ------
        ConfigError
            No rule of this name is registered.
        """
        chosen = rule(self.kind)
        for shard_id, d in delta.items():
            theta = params[shard_id]
            d = d.astype(theta.dtype, copy=False)
            step = chosen.step(d, Slots(state, shard_id, theta), self._hyper(theta.dtype.type))
            params[shard_id] = theta + step

    def _hyper(self, dtype: type[np.floating]) -> Hyper:
        return Hyper(
            dtype(self.learning_rate),
            dtype(self.beta1),
            dtype(self.beta2),
            dtype(self.tau),
            dtype(1 - self.beta1),
            dtype(1 - self.beta2),
        )
