"""Streaming weighted means of shards.

A zone never keeps individual updates: each accepted shard is folded into a running
float64 sum ``Σ w_i x_i`` and the sum of weights ``Σ w_i``, so memory is O(model)
whatever the number of sites. ``finalize`` returns the weighted mean in each shard's
original dtype.

The sums stay finite by construction when what is folded is bounded: with every
weight ``w ≤ W``, every value ``|x| ≤ V`` and each of ``N`` sites folded once per shard,
``|Σ w x| ≤ N·W·V``, which the zone's bounds keep far below float64's ≈ 1.8·10^308
(``aggregation`` in the config, :class:`fedshard.config.AggregationConfig`; the zone
checks values and weights before it folds).

The fold is done in cache-sized blocks: multiplying a float32 block into a reused
float64 buffer and adding it in place keeps the memory traffic near one read of the
shard plus one read-write of the accumulator, instead of materialising a full-size
float64 temporary per shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedshard.errors import ShardError

__all__ = ["BLOCK_VALUES", "ShardAccumulator", "WeightedMean"]

BLOCK_VALUES = 1 << 15  # 32 Ki values: 256 KiB of float64 scratch, stays in L2


def all_finite(values: np.ndarray) -> bool:
    """True if every value is finite.

    A float64 sum of finite float32/float16 values cannot overflow, so the sum is
    finite exactly when every value is; this costs one read instead of a boolean
    temporary of the array's size.
    """
    if values.dtype.itemsize >= 8:
        return bool(np.isfinite(values).all())
    with np.errstate(invalid="ignore"):  # inf + -inf is what we are looking for, not a warning
        return bool(np.isfinite(np.add.reduce(values, axis=None, dtype=np.float64)))


@dataclass(slots=True)
class WeightedMean:
    """Running ``Σ w x`` (float64) and ``Σ w`` of one shard."""

    total: np.ndarray
    weight: float
    dtype: np.dtype

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: np.dtype | str) -> WeightedMean:
        """An empty accumulator for arrays of ``shape`` and ``dtype``."""
        return cls(np.zeros(shape, dtype=np.float64), 0.0, np.dtype(dtype))

    def add(self, values: np.ndarray, weight: float, scratch: np.ndarray, scale: float = 1.0) -> None:
        """Fold ``weight * scale * values`` into the sum and ``weight`` into ``Σ w``, block
        by block through ``scratch`` (``scale`` < 1: an update clipped to a norm bound)."""
        if values.shape != self.total.shape:
            raise ShardError(f"cannot add shape {values.shape} to accumulator of shape {self.total.shape}")
        flat_in = values.reshape(-1)
        flat_acc = self.total.reshape(-1)
        n = flat_in.shape[0]
        step = scratch.shape[0]
        w = float(weight)
        factor = w * float(scale)
        for start in range(0, n, step):
            stop = min(start + step, n)
            buf = scratch[: stop - start]
            # dtype=float64: multiply in float64, not in the shard's dtype (float16 would
            # overflow, float32 would round before the sum).
            np.multiply(flat_in[start:stop], factor, out=buf, dtype=np.float64)
            np.add(flat_acc[start:stop], buf, out=flat_acc[start:stop])
        self.weight += w

    def add_sum(self, total: np.ndarray, weight: float) -> None:
        """Fold another accumulator's ``Σ w x`` (float64) and ``Σ w`` in (hierarchical reduction)."""
        if total.shape != self.total.shape:
            raise ShardError(f"cannot add a partial sum of shape {total.shape} to one of shape {self.total.shape}")
        np.add(self.total, total, out=self.total)
        self.weight += float(weight)

    def mean(self) -> np.ndarray:
        """The weighted mean, in the shard's original dtype."""
        if self.weight <= 0:
            raise ShardError("cannot take the mean of an accumulator that received nothing")
        return (self.total / self.weight).astype(self.dtype)


class ShardAccumulator:
    """Weighted running means of many shards, O(model) memory.

    Not thread-safe: a zone serialises commits to one accumulator.
    """

    def __init__(self, block_values: int = BLOCK_VALUES) -> None:
        self._means: dict[str, WeightedMean] = {}
        self._scratch = np.empty(block_values, dtype=np.float64)

    def add(self, shard_id: str, values: np.ndarray, weight: float, scale: float = 1.0) -> None:
        """Fold one shard, ``weight * scale * values``, into the running sum for ``shard_id``
        (``scale`` scales the values only, not the weight)."""
        mean = self._means.get(shard_id)
        if mean is None:
            mean = self._means[shard_id] = WeightedMean.zeros(values.shape, values.dtype)
        mean.add(values, weight, self._scratch, scale)

    def add_sum(self, shard_id: str, total: np.ndarray, weight: float, dtype: np.dtype | str) -> None:
        """Fold a partial ``Σ w x`` (float64) and its ``Σ w`` for ``shard_id``; means come out in ``dtype``."""
        mean = self._means.get(shard_id)
        if mean is None:
            mean = self._means[shard_id] = WeightedMean.zeros(total.shape, dtype)
        mean.add_sum(total, weight)

    def partial_sums(self) -> dict[str, tuple[np.ndarray, float]]:
        """``Σ w x`` (float64) and ``Σ w`` of every shard, to forward to another zone."""
        return {sid: (m.total, m.weight) for sid, m in self._means.items()}

    def __contains__(self, shard_id: object) -> bool:
        return shard_id in self._means

    def __len__(self) -> int:
        return len(self._means)

    def weight(self, shard_id: str) -> float:
        """Total weight folded into ``shard_id`` so far."""
        return self._means[shard_id].weight

    @property
    def nbytes(self) -> int:
        """Memory held by the running sums."""
        return sum(m.total.nbytes for m in self._means.values()) + self._scratch.nbytes

    def finalize(self) -> dict[str, np.ndarray]:
        """Weighted means of every shard received, in their original dtypes."""
        return {sid: m.mean() for sid, m in self._means.items()}
