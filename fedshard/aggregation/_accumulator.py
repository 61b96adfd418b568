"""Streaming weighted means of shards, in float32 sums at the scale of the values.

A zone never keeps individual updates: each accepted shard is folded into a running
sum and the sum of weights ``Σ w_i``, so memory is O(model) whatever the number of
sites. ``finalize`` returns the weighted mean in each shard's original dtype.

**Scaled sums.** The round's weights are fixed when it opens, so the accumulator is
given ``unit``, the largest of them, and folds each term as ``(w_i / unit)·x_i``: every
factor is at most 1, and a site of the largest weight (all sites, when weights are
equal) is folded by one in-place add, at the speed of NumPy's ``a += x``. The sum stays
at the scale of the values: with ``|x| ≤ V`` (``aggregation.max_value``) and ``N``
sites, ``|S| ≤ N·V ≤ N·10^15``, finite in float32 (max ≈ 3.4·10^38) for any
``N < 10^23``, whatever the weights. The mean is ``S · unit / Σ w``.

**Precision and its bound.** Float32 and float16 shards are summed in float32 (one
model's worth of memory, not two), float64 shards in float64. Compensated (Kahan)
summation was considered and not used: with a float32 compensation it holds as much
memory as a float64 sum and moves as many bytes per value (in more passes), and with a
16-bit compensation (1.5x the model) it measured about 4x slower than the plain float32
fold in NumPy. Plain recursive summation of ``N`` terms has the classic
bound (Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2), so with ``u``
the sum's unit roundoff (2^-24 for float32, 2^-53 for float64), ``T = Σ w_i |x_i| / Σ w_i``
(the weighted mean of the magnitudes) and ``m`` the exact weighted mean, every value of
the mean a zone publishes satisfies

    |m̂ − m| ≤ γ_{N+3} · T  (+ the rounding to a float16 shard's dtype, and
                              N·2^-149·unit/Σw for terms below float32's normal range),

with ``γ_k = k·u / (1 − k·u)`` ≈ ``k·u``: one rounding per fold, two for each term's
factor and two for the final scaling. :func:`sum_dtype` keeps float32 only while that
bound is at most :data:`FLOAT32_SUM_TOLERANCE` (2^-14 ≈ 6·10^-5 of ``T``), i.e. for
shards that at most :data:`FLOAT32_MAX_SITES` sites contribute to; a round that selects
more sites sums in float64 (twice the memory). ``tests/unit/aggregation/test_accumulator_error.py``
measures the error of 1000 sites' random updates against a float64 reference.

The folds that need a factor are done in cache-sized blocks: multiplying a block into
a reused scratch buffer and adding it in place keeps the memory traffic near one read
of the shard plus one read-write of the sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedshard.errors import ShardError

__all__ = [
    "BLOCK_VALUES",
    "FLOAT32_MAX_SITES",
    "FLOAT32_SUM_TOLERANCE",
    "ShardAccumulator",
    "WeightedMean",
    "error_bound",
    "sum_dtype",
]

BLOCK_VALUES = 1 << 15  # 32 Ki values: 128-256 KiB of scratch, stays in L2

FLOAT32_SUM_TOLERANCE = 2.0**-14
"""Largest ``γ_{N+3}`` (error of a published mean relative to ``T``, see the module
docstring) accepted from float32 sums; beyond it shards are summed in float64."""

_U32 = 2.0**-24
FLOAT32_MAX_SITES = int(FLOAT32_SUM_TOLERANCE / (_U32 * (1 + FLOAT32_SUM_TOLERANCE))) - 3
"""Most contributions per shard summed in float32 (1020): ``γ_{N+3} ≤ 2^-14``."""


def sum_dtype(dtype: np.dtype | str, sites: int) -> np.dtype:
    """The dtype a shard of ``dtype`` is summed in when at most ``sites`` sites contribute:
    float32 for float32 and narrower values while ``sites ≤ FLOAT32_MAX_SITES``, else float64."""
    if np.dtype(dtype).itemsize <= 4 and sites <= FLOAT32_MAX_SITES:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def error_bound(sites: int, magnitude: np.ndarray | float, dtype: np.dtype | str = "<f4") -> np.ndarray | float:
    """The stated bound on ``|m̂ − m|`` of a mean of ``sites`` terms summed in ``dtype``,
    given ``magnitude`` = ``T = Σ w|x| / Σ w`` (see the module docstring; underflow aside)."""
    u = float(np.finfo(dtype).eps) / 2
    k = sites + 3
    return k * u / (1 - k * u) * magnitude


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
    """Running ``S = Σ (w/unit)·x`` and ``Σ w`` of one shard (see the module docstring)."""

    total: np.ndarray
    weight: float
    dtype: np.dtype
    unit: float = 1.0
    final: bool = False  # the sum became the mean (in place): nothing more can be added

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: np.dtype | str, unit: float = 1.0, sites: int = 1) -> WeightedMean:
        """An empty accumulator for arrays of ``shape`` and ``dtype``, for terms of weight at
        most ``unit`` from at most ``sites`` sites (they choose the sum's dtype: :func:`sum_dtype`)."""
        if not (unit > 0 and math.isfinite(unit)):
            raise ShardError(f"the unit weight must be positive and finite, got {unit!r}")
        return cls(np.zeros(shape, dtype=sum_dtype(dtype, sites)), 0.0, np.dtype(dtype), float(unit))

    def add(self, values: np.ndarray, weight: float, scratch: np.ndarray, scale: float = 1.0) -> None:
        """Fold ``(weight * scale / unit) * values`` into the sum and ``weight`` into ``Σ w``,
        block by block through ``scratch`` (``scale`` < 1: an update clipped to a norm bound).
        A factor of exactly 1 is one in-place add, without ``scratch``."""
        if self.final:
            raise ShardError("cannot add to an accumulator whose mean was taken")
        if values.shape != self.total.shape:
            raise ShardError(f"cannot add shape {values.shape} to accumulator of shape {self.total.shape}")
        w = float(weight)
        factor = w * float(scale) / self.unit
        flat_acc = self.total.reshape(-1)
        flat_in = values.reshape(-1)
        if factor == 1.0:
            # Widening float16 → float32 is exact; float64 values into a float32 sum never
            # happen (sum_dtype), so this is the sum's one rounding per fold.
            np.add(flat_acc, flat_in, out=flat_acc, casting="same_kind")
        else:
            n = flat_in.shape[0]
            step = scratch.shape[0]
            f = self.total.dtype.type(factor)
            for start in range(0, n, step):
                stop = min(start + step, n)
                buf = scratch[: stop - start]
                # In the sum's dtype, not the shard's: float16 times a factor would round twice.
                np.multiply(flat_in[start:stop], f, out=buf, dtype=self.total.dtype)
                np.add(flat_acc[start:stop], buf, out=flat_acc[start:stop])
        self.weight += w

    def add_sum(self, total: np.ndarray, weight: float) -> None:
        """Fold another accumulator's ``S`` (same ``unit``) and ``Σ w`` in (hierarchical reduction)."""
        if self.final:
            raise ShardError("cannot add to an accumulator whose mean was taken")
        if total.shape != self.total.shape:
            raise ShardError(f"cannot add a partial sum of shape {total.shape} to one of shape {self.total.shape}")
        np.add(self.total, total, out=self.total, casting="same_kind")
        self.weight += float(weight)

    def mean(self) -> np.ndarray:
        """The weighted mean, in the shard's original dtype.

        Taken in place (the sum is scaled, then becomes the mean, converted only where the
        shard's dtype differs from the sum's): a float32 shard summed in float32 needs no
        second array of its size. Nothing can be added afterwards.
        """
        if self.final:
            return self.total
        if self.weight <= 0:
            raise ShardError("cannot take the mean of an accumulator that received nothing")
        np.multiply(self.total, self.total.dtype.type(self.unit / self.weight), out=self.total)
        self.total = self.total.astype(self.dtype, copy=False)
        self.final = True
        return self.total


class ShardAccumulator:
    """Weighted running means of many shards, O(model) memory (see the module docstring).

    Parameters
    ----------
    unit:
        The largest weight a term can have (a zone: the largest of the round's fixed
        weights); each term is folded as ``(w / unit)·x``.
    sites:
        The most sites that contribute to a shard (a zone: the round's selected sites);
        it chooses float32 or float64 sums (:func:`sum_dtype`).
    block_values:
        Values per block of a fold that needs a factor.

    Not thread-safe: a zone serialises commits to one accumulator.
    """

    def __init__(self, unit: float = 1.0, sites: int = 1, block_values: int = BLOCK_VALUES) -> None:
        self.unit = float(unit)
        self.sites = sites
        self._means: dict[str, WeightedMean] = {}
        self._block = block_values
        self._scratch: dict[np.dtype, np.ndarray] = {}

    def _mean_for(self, shard_id: str, shape: tuple[int, ...], dtype: np.dtype | str) -> WeightedMean:
        mean = self._means.get(shard_id)
        if mean is None:
            mean = self._means[shard_id] = WeightedMean.zeros(shape, dtype, self.unit, self.sites)
        return mean

    def add(self, shard_id: str, values: np.ndarray, weight: float, scale: float = 1.0) -> None:
        """Fold one shard, ``weight * scale * values``, into the running sum for ``shard_id``
        (``scale`` scales the values only, not the weight)."""
        mean = self._mean_for(shard_id, values.shape, values.dtype)
        scratch = self._scratch.get(mean.total.dtype)
        if scratch is None:
            scratch = self._scratch[mean.total.dtype] = np.empty(self._block, dtype=mean.total.dtype)
        mean.add(values, weight, scratch, scale)

    def add_sum(self, shard_id: str, total: np.ndarray, weight: float, dtype: np.dtype | str) -> None:
        """Fold a partial ``S = Σ (w/unit)·x`` (same ``unit``) and its ``Σ w`` for ``shard_id``;
        means come out in ``dtype``."""
        self._mean_for(shard_id, total.shape, dtype).add_sum(total, weight)

    def partial_sums(self) -> dict[str, tuple[np.ndarray, float]]:
        """``S = Σ (w/unit)·x`` (in the sum's dtype) and ``Σ w`` of every shard, to forward to another zone."""
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
        """Memory held by the running sums and the scratch buffers."""
        return sum(m.total.nbytes for m in self._means.values()) + sum(s.nbytes for s in self._scratch.values())

    def finalize(self) -> dict[str, np.ndarray]:
        """Weighted means of every shard received, in their original dtypes (see
        :meth:`WeightedMean.mean`: float32 sums become the means in place)."""
        return {sid: m.mean() for sid, m in self._means.items()}
