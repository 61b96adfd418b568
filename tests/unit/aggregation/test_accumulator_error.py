"""The accumulator's stated error bound, measured: 1000 sites' random updates against a
float64 reference (see :mod:`fedshard.aggregation._accumulator`)."""

from __future__ import annotations

import numpy as np

from fedshard.aggregation import ShardAccumulator, error_bound

SITES = 1000
SIZE = 4096


def _round(seed: int) -> tuple[list[float], list[np.ndarray]]:
    """Weights like example counts, updates of mixed signs and scales (some cancel)."""
    rng = np.random.default_rng(seed)
    weights = [float(w) for w in rng.integers(1, 5000, size=SITES)]
    offset = rng.normal(0, 1, size=SIZE)  # a shared direction, so that sums grow
    updates = [(offset + rng.normal(0, 1, size=SIZE) * rng.uniform(0.01, 3)).astype(np.float32) for _ in weights]
    return weights, updates


def _reference(weights: list[float], updates: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The exact weighted mean (float64) and ``T = Σ w|x| / Σ w``."""
    total = sum(w * u.astype(np.float64) for w, u in zip(weights, updates, strict=True))
    magnitude = sum(w * np.abs(u.astype(np.float64)) for w, u in zip(weights, updates, strict=True))
    return total / sum(weights), magnitude / sum(weights)


def _zone_mean(weights: list[float], updates: list[np.ndarray]) -> np.ndarray:
    acc = ShardAccumulator(unit=max(weights), sites=len(weights))
    for w, u in zip(weights, updates, strict=True):
        acc.add("s", u, w)
    return acc.finalize()["s"]


def _float16_sum_mean(weights: list[float], updates: list[np.ndarray]) -> np.ndarray:
    """The same scaled recursive summation with a float16 sum: a precision the bound must catch."""
    unit, total = max(weights), np.zeros(SIZE, np.float16)
    for w, u in zip(weights, updates, strict=True):
        total += (u * np.float32(w / unit)).astype(np.float16)
    return total.astype(np.float32) * np.float32(unit / sum(weights))


def test_1000_sites_in_float32_are_within_the_stated_bound() -> None:
    for seed in range(3):
        weights, updates = _round(seed)
        exact, magnitude = _reference(weights, updates)
        mean = _zone_mean(weights, updates)

        assert mean.dtype == np.float32
        error = np.abs(mean.astype(np.float64) - exact)
        assert np.all(error <= error_bound(SITES, magnitude, np.float32))
        # not vacuous: the float32 sum does round (a float64 one would be ~10^9 times closer)
        assert error.max() > 1e3 * error_bound(SITES, magnitude, np.float64).max()


def test_the_bound_catches_a_sum_in_lower_precision() -> None:
    weights, updates = _round(7)
    exact, magnitude = _reference(weights, updates)

    error = np.abs(_float16_sum_mean(weights, updates).astype(np.float64) - exact)

    assert np.any(error > error_bound(SITES, magnitude, np.float32))
