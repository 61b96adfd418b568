"""Pure checks of what a zone folds: value ranges, norms, the fixed weights of a partial sum.

The rules that use them (refuse or clip, and the bounds themselves) are
``aggregation`` in the federation config (:class:`fedshard.config.AggregationConfig`);
why they keep every sum finite (float32 sums of ``(w/unit)·x``) is written there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["SUM_TOLERANCE", "extremes", "fixed_weight_of", "norm_scale", "squared_norm", "within"]

SUM_TOLERANCE = 1e-9
"""Relative slack when a float64 sum computed elsewhere (another zone's ``Σ w``) is
compared with its bound: sums taken in another order differ in the last bits (float32
partial sums get the accumulator's stated bound instead)."""


def extremes(values: np.ndarray) -> tuple[float, float]:
    """``(min, max)`` of ``values`` as floats; NaN if any value is NaN, ±inf if any is infinite.

    Two reads of the array and no temporary of its size (unlike ``abs(values).max()``).
    """
    if values.size == 0:
        return 0.0, 0.0
    return float(values.min()), float(values.max())


def within(low: float, high: float, bound: float) -> bool:
    """True if ``[low, high]`` is finite and inside ``[-bound, bound]``."""
    return math.isfinite(low) and math.isfinite(high) and -bound <= low and high <= bound


def squared_norm(values: np.ndarray) -> float:
    """``Σ x²`` of ``values`` (finite values; half precision is summed in float32, and a
    float32 sum that overflows is taken again in float64)."""
    flat = values.reshape(-1)
    if flat.dtype.itemsize < 4:
        flat = flat.astype(np.float32)
    with np.errstate(over="ignore"):  # a float32 overflow is retried below, not a warning
        total = float(np.dot(flat, flat))
    if not math.isfinite(total):
        wide = flat.astype(np.float64)
        total = float(np.dot(wide, wide))
    return total


def norm_scale(squared: float, bound: float) -> float:
    """The factor that brings an update of squared L2 norm ``squared`` within norm ``bound``:
    1.0 when it already is, else ``bound / norm`` (< 1)."""
    norm = math.sqrt(squared)
    return 1.0 if norm <= bound else bound / norm


def fixed_weight_of(contributors: Iterable[str], weights: Mapping[str, float], default: float) -> float:
    """``Σ w`` of ``contributors`` by the round's fixed ``weights`` (``default`` for a site not named)."""
    return math.fsum(weights.get(c, default) for c in contributors)
