"""Property tests: shard split/join round-trips bit-exactly and covers every value once."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshard.sharding import ShardPlan

MAX_VALUES = 20_000  # keeps a 4-D tensor of sides up to 70 cheap to split


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, ...]:
    """0 to 4 dimensions of 1..70, at most MAX_VALUES values in all."""
    ndim = draw(st.integers(0, 4))
    shape: list[int] = []
    for _ in range(ndim):
        room = MAX_VALUES // math.prod(shape)
        shape.append(draw(st.integers(1, min(70, room))))
    return tuple(shape)


tiles = st.tuples(st.integers(1, 40), st.integers(1, 40))
float_dtypes = st.sampled_from(["<f2", "<f4", "<f8"])


def as_bytes(array: np.ndarray) -> np.ndarray:
    """The raw bytes of ``array`` (0-d included), so NaN payloads compare too."""
    return array.reshape(-1).view(np.uint8)


def random_bits(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Arbitrary bit patterns, so NaNs with payloads, infinities and subnormals all occur."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.random.default_rng(seed).bytes(math.prod(shape) * itemsize)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


@settings(max_examples=100, deadline=None)
@given(
    shape=shapes(),
    dtype=float_dtypes,
    tile=tiles,
    seed=st.integers(0, 2**32 - 1),
    fortran=st.booleans(),
)
def test_split_then_join_is_bit_exact(
    shape: tuple[int, ...], dtype: str, tile: tuple[int, int], seed: int, fortran: bool
) -> None:
    tensor = random_bits(shape, dtype, seed)
    source = np.array(tensor, order="F") if fortran else tensor
    plan = ShardPlan.from_state_dict({"t": source}, tile=tile)

    shards = plan.split({"t": source})
    joined = plan.join(shards)["t"]

    assert joined.shape == tensor.shape
    assert joined.dtype == np.dtype(dtype)
    assert np.array_equal(as_bytes(joined), as_bytes(tensor))
    for shard_id, array in shards.items():
        spec = plan.shard(shard_id)
        assert array.shape == spec.shape
        assert array.shape[0] <= tile[0]
        assert array.shape[1] <= tile[1]
    assert sum(a.size for a in shards.values()) == tensor.size
    assert plan.num_values == tensor.size


@settings(max_examples=100, deadline=None)
@given(shape=shapes(), tile=tiles)
def test_every_value_lands_in_exactly_one_shard(shape: tuple[int, ...], tile: tuple[int, int]) -> None:
    # Each value is its own flat index (exact in float64), so the shards' values show
    # which positions they cover.
    size = math.prod(shape)
    tensor = np.arange(size, dtype=np.float64).reshape(shape)
    plan = ShardPlan.from_state_dict({"t": tensor}, tile=tile)

    shards = plan.split({"t": tensor})

    covered = np.sort(np.concatenate([a.reshape(-1) for a in shards.values()]))
    np.testing.assert_array_equal(covered, np.arange(size, dtype=np.float64))
    rows, cols = plan.tensors[0].view2d
    assert len(shards) == math.ceil(rows / tile[0]) * math.ceil(cols / tile[1])
    assert len(set(shards)) == len(shards) == len(plan)


@settings(max_examples=50, deadline=None)
@given(
    shapes_=st.lists(shapes(), min_size=1, max_size=3),
    dtype=float_dtypes,
    tile=tiles,
    seed=st.integers(0, 2**32 - 1),
)
def test_multi_tensor_plan_round_trips_through_json(
    shapes_: list[tuple[int, ...]], dtype: str, tile: tuple[int, int], seed: int
) -> None:
    tensors = {f"layer{i}.weight": random_bits(s, dtype, seed + i) for i, s in enumerate(shapes_)}
    plan = ShardPlan.from_state_dict(tensors, tile=tile)
    again = ShardPlan.from_json(plan.to_json())

    joined = again.join(plan.split(tensors))

    assert again.digest == plan.digest
    assert again.shard_ids == plan.shard_ids
    for name, tensor in tensors.items():
        assert np.array_equal(as_bytes(joined[name]), as_bytes(tensor))
