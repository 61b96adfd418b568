"""The rules sites apply a published aggregate with (server-side optimisers), one per module,
behind :class:`ServerRule`, named in a registry.

A new rule is one module here defining a class with the :class:`ServerRule` methods, plus
its line in :data:`RULES`; a federation then names it in ``training.server_optimizer.kind``.
Every rule uses the aggregate only, so with DP on it is post-processing and costs no
privacy; it must compute element-wise in a fixed order, so every site gets the same bits.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from fedshard.aggregation.server_rules._slots import Hyper, Slots
from fedshard.aggregation.server_rules.adam import Adam
from fedshard.aggregation.server_rules.avg import Avg
from fedshard.aggregation.server_rules.momentum import Momentum
from fedshard.registry import Registry

__all__ = ["RULES", "Hyper", "ServerRule", "Slots", "register", "rule"]


@runtime_checkable
class ServerRule(Protocol):
    """One way to apply an aggregate: ``θ ← θ + step``."""

    name: str
    """What ``training.server_optimizer.kind`` names it by."""

    def step(self, delta: np.ndarray, slots: Slots, hyper: Hyper) -> np.ndarray:
        """The step to add to one shard's parameters, given the aggregate ``delta`` (the
        parameters' dtype), the shard's optimiser ``slots`` (read and updated here) and the
        federation's ``hyper``-parameters (in that dtype)."""
        ...


RULES: Registry[ServerRule] = Registry(
    "server optimiser", "training.server_optimizer.kind", (Avg(), Momentum(), Adam())
)
"""Every rule by name: the built-in ones (a new one: its line here)."""


def register(new: ServerRule) -> None:
    """Add ``new`` to :data:`RULES` (a rule of a task's own, registered before the federation
    runs); :class:`ConfigError` if another rule has its name."""
    RULES.register(new)


def rule(name: str) -> ServerRule:
    """The rule named ``name``; :class:`ConfigError` in one line naming the rules that exist."""
    return RULES.get_part(name)
