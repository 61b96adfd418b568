"""Unit tests of streaming weighted means (:mod:`fedshard.aggregation`)."""

from __future__ import annotations

import numpy as np
import pytest

from fedshard.aggregation import (
    BLOCK_VALUES,
    FLOAT32_MAX_SITES,
    FLOAT32_SUM_TOLERANCE,
    ShardAccumulator,
    WeightedMean,
    all_finite,
    error_bound,
    sum_dtype,
)
from fedshard.errors import ShardError

WEIGHTS = (3.0, 0.5, 11.25)


def _updates(shape: tuple[int, ...], dtype: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 2.0, size=shape).astype(dtype) for _ in WEIGHTS]


def _reference(updates: list[np.ndarray], weights: tuple[float, ...]) -> np.ndarray:
    total = sum(w * u.astype(np.float64) for w, u in zip(weights, updates, strict=True))
    return total / sum(weights)


SIZES = [BLOCK_VALUES * 2 + 123, BLOCK_VALUES - 1, 1]


def _within_bound(result: np.ndarray, updates: list[np.ndarray], weights: tuple[float, ...], dtype: str) -> None:
    """``result`` is the weighted mean within the accumulator's stated bound (plus the
    rounding to a float16 shard's dtype)."""
    reference = _reference(updates, weights)
    magnitude = _reference([np.abs(u) for u in updates], weights)
    bound = error_bound(len(updates), magnitude, sum_dtype(dtype, len(updates)))
    bound = bound + (np.finfo(dtype).eps / 2) * np.abs(reference) * (np.dtype(dtype).itemsize < 4)
    assert np.all(np.abs(result.astype(np.float64) - reference) <= bound)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_weighted_mean_is_within_the_stated_bound_with_default_blocks(size: int, dtype: str) -> None:
    updates = _updates((size,), dtype)
    mean = WeightedMean.zeros((size,), dtype, unit=max(WEIGHTS))
    scratch = np.empty(BLOCK_VALUES, dtype=mean.total.dtype)

    for w, u in zip(WEIGHTS, updates, strict=True):
        mean.add(u, w, scratch)

    assert mean.weight == sum(WEIGHTS)
    assert mean.total.dtype == (np.float64 if dtype == "<f8" else np.float32)
    _within_bound(mean.mean(), updates, WEIGHTS, dtype)


@pytest.mark.parametrize("block_values", [1, 7, 64, 1000])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_accumulator_mean_with_small_blocks(block_values: int, dtype: str) -> None:
    shape = (37, 29)  # 1073 values: not a multiple of any block size above
    updates = _updates(shape, dtype, seed=block_values)
    acc = ShardAccumulator(block_values=block_values)

    for w, u in zip(WEIGHTS, updates, strict=True):
        acc.add("w#r0c0", u, w)
    result = acc.finalize()["w#r0c0"]

    assert result.dtype == np.dtype(dtype)
    assert result.shape == shape
    _within_bound(result, updates, WEIGHTS, dtype)


def test_a_term_of_the_unit_weight_is_folded_exactly_by_one_add() -> None:
    values = np.float32([0.1, -3.5, 1e-30, 7e30])
    acc = ShardAccumulator(unit=5.0, block_values=1)

    acc.add("s", values, 5.0)
    (total, weight) = acc.partial_sums()["s"]
    np.testing.assert_array_equal(total, values)  # factor 1: no multiply, no rounding
    assert weight == 5.0 and total.dtype == np.float32
    acc.add("s", values, 5.0)
    np.testing.assert_array_equal(acc.finalize()["s"], values)


def test_the_mean_is_taken_in_place_and_ends_the_accumulator() -> None:
    acc = ShardAccumulator(unit=2.0)
    acc.add("s", np.ones(4, np.float32), 2.0)
    acc.add("s", np.full(4, 3.0, np.float32), 2.0)
    (total, _) = acc.partial_sums()["s"]

    mean = acc.finalize()["s"]
    assert mean is total  # no second array of the shard's size
    np.testing.assert_array_equal(mean, np.full(4, 2.0, np.float32))
    assert acc.finalize()["s"] is mean
    with pytest.raises(ShardError, match="mean was taken"):
        acc.add("s", np.ones(4, np.float32), 2.0)


def test_accumulator_large_shard_crosses_block_boundaries() -> None:
    size = BLOCK_VALUES * 3 + 5
    updates = _updates((size,), "<f8", seed=9)
    acc = ShardAccumulator()

    for w, u in zip(WEIGHTS, updates, strict=True):
        acc.add("big", u, w)
    result = acc.finalize()["big"]

    np.testing.assert_allclose(result, _reference(updates, WEIGHTS), rtol=1e-12, atol=0)
    # Values beyond the first block were folded with the same weights as the first block.
    np.testing.assert_allclose(result[-5:], _reference([u[-5:] for u in updates], WEIGHTS), rtol=1e-12, atol=0)


def test_float16_values_times_large_weights_do_not_overflow() -> None:
    values = np.full((4, 4), 60000.0, dtype=np.float16)  # near float16's max of 65504
    acc = ShardAccumulator(block_values=5)

    acc.add("s", values, 1000.0)
    acc.add("s", values, 3000.0)
    result = acc.finalize()["s"]

    assert result.dtype == np.float16
    np.testing.assert_array_equal(result, values)


def test_a_factor_is_applied_in_the_sums_dtype() -> None:
    values = np.full(10, 0.1, dtype=np.float16)
    mean = WeightedMean.zeros((10,), np.float16, unit=3.0)

    mean.add(values, 1.0, np.empty(4, dtype=np.float32))

    expected = np.float32(np.float16(0.1)) * np.float32(1.0 / 3.0)  # float32, not float16, products
    np.testing.assert_array_equal(mean.total, np.full(10, expected, dtype=np.float32))


def test_sums_are_float64_beyond_the_float32_site_limit() -> None:
    assert sum_dtype("<f4", FLOAT32_MAX_SITES) == np.float32
    assert sum_dtype("<f2", 1) == np.float32
    assert sum_dtype("<f4", FLOAT32_MAX_SITES + 1) == np.float64
    assert sum_dtype("<f8", 1) == np.float64
    assert error_bound(FLOAT32_MAX_SITES, 1.0) <= FLOAT32_SUM_TOLERANCE < error_bound(FLOAT32_MAX_SITES + 1, 1.0)
    acc = ShardAccumulator(sites=FLOAT32_MAX_SITES + 1)
    acc.add("s", np.ones(3, np.float32), 1.0)
    assert acc.partial_sums()["s"][0].dtype == np.float64
    assert acc.finalize()["s"].dtype == np.float32


def test_several_shards_are_kept_apart() -> None:
    acc = ShardAccumulator(block_values=3)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((1, 1), 4.0, dtype=np.float64)

    acc.add("a", a, 2.0)
    acc.add("b", b, 1.0)
    acc.add("a", a + 3, 1.0)

    assert len(acc) == 2
    assert "a" in acc
    assert "c" not in acc
    assert acc.weight("a") == 3.0
    assert acc.weight("b") == 1.0
    result = acc.finalize()
    np.testing.assert_allclose(result["a"], (2 * a + (a + 3)) / 3, rtol=1e-6)
    np.testing.assert_array_equal(result["b"], b)
    assert result["b"].dtype == np.float64
    assert acc.nbytes == 6 * 4 + 1 * 8 + 3 * 4 + 3 * 8  # float32 and float64 sums, one scratch of each


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_output_dtype_equals_input_dtype(dtype: str) -> None:
    acc = ShardAccumulator()
    acc.add("s", np.ones((2, 2), dtype=dtype), 1.5)

    assert acc.finalize()["s"].dtype == np.dtype(dtype)


def test_mean_of_nothing_is_a_shard_error() -> None:
    with pytest.raises(ShardError, match="received nothing"):
        WeightedMean.zeros((2, 2), np.float32).mean()


def test_mean_after_only_zero_weight_is_a_shard_error() -> None:
    mean = WeightedMean.zeros((2,), np.float32)
    mean.add(np.ones(2, np.float32), 0.0, np.empty(2))

    with pytest.raises(ShardError):
        mean.mean()


def test_empty_accumulator_finalizes_to_nothing() -> None:
    assert ShardAccumulator().finalize() == {}


def test_shape_mismatch_is_a_shard_error_and_adds_nothing() -> None:
    acc = ShardAccumulator()
    acc.add("s", np.ones((4, 4), np.float32), 2.0)

    with pytest.raises(ShardError, match=r"shape \(2, 8\)"):
        acc.add("s", np.full((2, 8), 9.0, np.float32), 5.0)

    assert acc.weight("s") == 2.0
    np.testing.assert_array_equal(acc.finalize()["s"], np.ones((4, 4), np.float32))


# all_finite -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 500, 999])
def test_all_finite_detects_nan_and_inf(dtype: str, bad: float, where: int) -> None:
    values = np.linspace(-1, 1, 1000).astype(dtype)
    values[where] = bad

    assert not all_finite(values)
    assert not all_finite(values.reshape(10, 100))


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_all_finite_detects_opposite_infinities(dtype: str) -> None:
    values = np.zeros(8, dtype=dtype)
    values[1], values[6] = np.inf, -np.inf

    assert not all_finite(values)


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_all_finite_accepts_finite_values(dtype: str) -> None:
    assert all_finite(np.linspace(-1, 1, 1000).astype(dtype))
    assert all_finite(np.zeros((0, 3), dtype=dtype))


def test_all_finite_accepts_huge_finite_float32() -> None:
    values = np.full(200_000, 3e38, dtype=np.float32)
    values[::2] = np.finfo(np.float32).max

    assert all_finite(values)
    assert all_finite(-values)


def test_all_finite_accepts_largest_float16_and_float64() -> None:
    assert all_finite(np.full(100_000, np.finfo(np.float16).max, dtype=np.float16))
    assert all_finite(np.full(1000, np.finfo(np.float64).max, dtype=np.float64))


def test_a_scale_shrinks_the_values_and_leaves_the_weight() -> None:
    acc = ShardAccumulator(block_values=3)  # several blocks
    values = np.arange(10, dtype=np.float32)
    acc.add("s", values, 4.0, scale=0.25)
    acc.add("s", values, 2.0)
    total, weight = acc.partial_sums()["s"]
    assert weight == 6.0
    np.testing.assert_array_equal(total, 3.0 * values.astype(np.float64))
