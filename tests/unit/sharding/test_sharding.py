"""Unit tests of :class:`fedshard.sharding.ShardPlan`: tiling, ids, split/join, identity."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from torch import nn

from fedshard.errors import ShardError
from fedshard.sharding import ShardPlan, TensorSpec


def _linear_plan(tile: tuple[int, int] = (32, 32)) -> ShardPlan:
    torch.manual_seed(0)
    return ShardPlan.from_state_dict(nn.Linear(40, 70).state_dict(), tile=tile)


# construction ---------------------------------------------------------------------------


def test_from_state_dict_of_torch_linear_lists_weight_and_bias() -> None:
    plan = _linear_plan()

    assert plan.tensors == (
        TensorSpec("weight", (70, 40), "<f4"),
        TensorSpec("bias", (70,), "<f4"),
    )


def test_from_state_dict_skips_integer_buffers() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))

    plan = ShardPlan.from_state_dict(model.state_dict())

    names = [t.name for t in plan.tensors]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var"]
    assert "1.num_batches_tracked" in model.state_dict()


def test_from_state_dict_of_numpy_dict_records_little_endian_dtypes() -> None:
    state = {
        "a": np.zeros((3, 2), dtype=np.float16),
        "b": np.zeros(4, dtype=">f8"),
        "steps": np.zeros((), dtype=np.int64),
        "mask": np.zeros(3, dtype=bool),
    }

    plan = ShardPlan.from_state_dict(state)

    assert plan.tensors == (TensorSpec("a", (3, 2), "<f2"), TensorSpec("b", (4,), "<f8"))


def test_tiles_of_70_by_40_with_tile_32() -> None:
    plan = _linear_plan((32, 32))

    weight_ids = [s.shard_id for s in plan.shards if s.tensor == "weight"]
    assert weight_ids == [f"weight#r{i}c{j}" for i in range(3) for j in range(2)]
    shapes = {s.shard_id: s.shape for s in plan.shards}
    assert shapes["weight#r0c0"] == (32, 32)
    assert shapes["weight#r0c1"] == (32, 8)
    assert shapes["weight#r1c0"] == (32, 32)
    assert shapes["weight#r2c0"] == (6, 32)
    assert shapes["weight#r2c1"] == (6, 8)


def test_one_dimensional_tensor_is_a_column() -> None:
    plan = _linear_plan((32, 32))

    bias = [(s.shard_id, s.shape) for s in plan.shards if s.tensor == "bias"]
    assert bias == [("bias#r0c0", (32, 1)), ("bias#r1c0", (32, 1)), ("bias#r2c0", (6, 1))]
    assert plan.num_values == 70 * 40 + 70
    assert plan.nbytes == (70 * 40 + 70) * 4
    assert len(plan) == 6 + 3


def test_shard_ids_name_tensor_row_and_column_tile() -> None:
    plan = ShardPlan.from_state_dict({"fc1.weight": np.zeros((4, 6), np.float32)}, tile=(4, 3))

    assert plan.shard_ids == ["fc1.weight#r0c0", "fc1.weight#r0c1"]
    spec = plan.shard("fc1.weight#r0c1")
    assert (spec.tensor, spec.rows, spec.cols, spec.dtype) == ("fc1.weight", slice(0, 4), slice(3, 6), "<f4")
    assert "fc1.weight#r0c1" in plan
    assert "fc1.weight#r1c0" not in plan


def test_small_tensor_is_one_shard() -> None:
    plan = ShardPlan.from_state_dict({"w": np.zeros((5, 7), np.float64)})

    assert plan.shard_ids == ["w#r0c0"]
    assert plan.shard("w#r0c0").shape == (5, 7)
    assert plan.shard("w#r0c0").nbytes == 5 * 7 * 8


def test_scalar_is_one_by_one() -> None:
    plan = ShardPlan.from_state_dict({"temperature": np.float32(2.5) * np.ones((), np.float32)})

    assert plan.tensors[0].shape == ()
    assert plan.shards[0].shape == (1, 1)
    shards = plan.split({"temperature": np.array(2.5, dtype=np.float32)})
    assert shards["temperature#r0c0"].shape == (1, 1)
    joined = plan.join(shards)
    assert joined["temperature"].shape == ()
    assert joined["temperature"] == np.float32(2.5)


def test_conv_weight_is_viewed_as_out_channels_by_the_rest() -> None:
    conv = nn.Conv2d(3, 8, kernel_size=5)

    plan = ShardPlan.from_state_dict(conv.state_dict(), tile=(32, 32))

    assert plan.tensors[0].view2d == (8, 75)
    weight = [(s.shard_id, s.shape) for s in plan.shards if s.tensor == "weight"]
    assert weight == [("weight#r0c0", (8, 32)), ("weight#r0c1", (8, 32)), ("weight#r0c2", (8, 11))]
    shards = plan.split(conv.state_dict())
    expected = conv.weight.detach().numpy().reshape(8, 75)[:, 32:64]
    np.testing.assert_array_equal(shards["weight#r0c1"], expected)


def test_unknown_shard_id_is_a_shard_error() -> None:
    with pytest.raises(ShardError, match=r"'weight#r9c9' is not in the shard plan"):
        _linear_plan().shard("weight#r9c9")


# split / join ---------------------------------------------------------------------------


def test_split_cuts_the_right_values() -> None:
    plan = ShardPlan.from_state_dict({"w": np.zeros((70, 40), np.float32)}, tile=(32, 32))
    w = np.arange(70 * 40, dtype=np.float32).reshape(70, 40)

    shards = plan.split({"w": w})

    np.testing.assert_array_equal(shards["w#r0c0"], w[:32, :32])
    np.testing.assert_array_equal(shards["w#r1c1"], w[32:64, 32:40])
    np.testing.assert_array_equal(shards["w#r2c1"], w[64:70, 32:40])
    for array in shards.values():
        assert array.flags.c_contiguous
        assert array.dtype == np.dtype("<f4")


def test_split_of_torch_state_dict_then_join_is_bit_exact() -> None:
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.Linear(36, 50))
    state = model.state_dict()
    plan = ShardPlan.from_state_dict(state, tile=(16, 16))

    joined = plan.join(plan.split(state))

    assert list(joined) == list(state)
    for name, tensor in state.items():
        expected = tensor.numpy()
        assert joined[name].shape == expected.shape
        assert joined[name].dtype == expected.dtype
        assert joined[name].tobytes() == expected.tobytes()


def test_split_join_keeps_nan_payloads_and_signed_zero() -> None:
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x7F800000, 0x00000001], dtype=np.uint32)
    values = np.resize(bits, 7 * 5).view(np.float32).reshape(7, 5)
    plan = ShardPlan.from_state_dict({"x": values}, tile=(3, 2))

    joined = plan.join(plan.split({"x": values}))

    assert joined["x"].view(np.uint32).tobytes() == values.view(np.uint32).tobytes()


def test_split_converts_big_endian_and_non_contiguous_input() -> None:
    plan = ShardPlan.from_state_dict({"w": np.zeros((6, 4), np.float64)}, tile=(4, 4))
    reference = np.linspace(-1.0, 1.0, 24).reshape(6, 4)
    big_endian = reference.astype(">f8")
    fortran = np.asfortranarray(reference)

    for source in (big_endian, fortran):
        shards = plan.split({"w": source})
        assert all(a.dtype.str == "<f8" for a in shards.values())
        np.testing.assert_array_equal(plan.join(shards)["w"], reference)


def test_split_returns_copies() -> None:
    plan = ShardPlan.from_state_dict({"w": np.zeros((2, 2), np.float32)})
    w = np.ones((2, 2), np.float32)

    shards = plan.split({"w": w})
    shards["w#r0c0"][0, 0] = 7.0

    assert w[0, 0] == 1.0


def test_split_ignores_extra_tensors_and_integer_buffers() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    plan = ShardPlan.from_state_dict(model.state_dict())

    shards = plan.split(model.state_dict())

    assert set(shards) == set(plan.shard_ids)
    assert not any(sid.startswith("1.num_batches_tracked") for sid in shards)


def test_split_missing_tensor_is_a_shard_error() -> None:
    plan = _linear_plan()
    state = {"weight": np.zeros((70, 40), np.float32)}

    with pytest.raises(ShardError, match=r"'bias'.*missing"):
        plan.split(state)


def test_split_wrong_shape_is_a_shard_error() -> None:
    plan = _linear_plan()
    state = {"weight": np.zeros((40, 70), np.float32), "bias": np.zeros(70, np.float32)}

    with pytest.raises(ShardError, match=r"'weight' has shape \(40, 70\), the plan says \(70, 40\)"):
        plan.split(state)


def test_split_wrong_dtype_is_a_shard_error() -> None:
    plan = _linear_plan()
    state = {"weight": np.zeros((70, 40), np.float64), "bias": np.zeros(70, np.float32)}

    with pytest.raises(ShardError, match="'weight' has dtype float64"):
        plan.split(state)


def test_join_missing_shard_is_a_shard_error() -> None:
    plan = _linear_plan()
    shards = plan.split(nn.Linear(40, 70).state_dict())
    del shards["weight#r1c1"]

    with pytest.raises(ShardError, match=r"'weight#r1c1' is missing"):
        plan.join(shards)


def test_join_wrong_shard_shape_is_a_shard_error() -> None:
    plan = _linear_plan()
    shards = plan.split(nn.Linear(40, 70).state_dict())
    shards["bias#r2c0"] = np.zeros((1, 6), np.float32)

    with pytest.raises(ShardError, match=r"'bias#r2c0' has shape \(1, 6\)"):
        plan.join(shards)


def test_hash_in_tensor_name_is_a_shard_error() -> None:
    with pytest.raises(ShardError, match="'#'"):
        ShardPlan.from_state_dict({"fc#1.weight": np.zeros(3, np.float32)})


def test_duplicate_tensor_names_are_a_shard_error() -> None:
    spec = TensorSpec("w", (2,), "<f4")

    with pytest.raises(ShardError, match="unique"):
        ShardPlan([spec, spec])


@pytest.mark.parametrize("tile", [(0, 4), (4, 0), (-1, 2), (4,), (1, 2, 3)])
def test_bad_tile_is_a_shard_error(tile: tuple[int, ...]) -> None:
    with pytest.raises(ShardError, match="tile"):
        ShardPlan([TensorSpec("w", (2,), "<f4")], tile=tile)  # type: ignore[arg-type]


# identity -------------------------------------------------------------------------------


def test_json_round_trip() -> None:
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.Linear(36, 50))
    plan = ShardPlan.from_state_dict(model.state_dict(), tile=(16, 16))

    again = ShardPlan.from_json(plan.to_json())

    assert again == plan
    assert again.tensors == plan.tensors
    assert again.tile == plan.tile
    assert again.shard_ids == plan.shard_ids
    assert [s.shape for s in again.shards] == [s.shape for s in plan.shards]
    assert again.to_json() == plan.to_json()
    assert ShardPlan.from_json(plan.to_json().encode()) == plan


def test_json_is_canonical_and_digest_is_its_sha256() -> None:
    plan = ShardPlan(
        [TensorSpec("fc.weight", (3, 2), "<f4"), TensorSpec("fc.bias", (3,), "<f4")],
        tile=(8, 4),
    )
    expected = (
        '{"format":1,"tensors":[{"dtype":"<f4","name":"fc.weight","shape":[3,2]},'
        '{"dtype":"<f4","name":"fc.bias","shape":[3]}],"tile":[8,4]}'
    )

    assert plan.to_json() == expected
    assert plan.digest == hashlib.sha256(expected.encode()).hexdigest()


def test_digest_is_stable_across_instances_and_sources() -> None:
    torch.manual_seed(1)
    from_torch = ShardPlan.from_state_dict(nn.Linear(40, 70).state_dict(), tile=(32, 32))
    from_numpy = ShardPlan.from_state_dict(
        {"weight": np.ones((70, 40), np.float32), "bias": np.ones(70, np.float32)}, tile=(32, 32)
    )

    assert from_torch.digest == from_numpy.digest
    assert from_torch.digest == _linear_plan((32, 32)).digest
    assert hash(from_torch) == hash(from_numpy)


@pytest.mark.parametrize(
    "other",
    [
        {"tile": (32, 16)},
        {"tensors": [TensorSpec("weight", (70, 40), "<f8"), TensorSpec("bias", (70,), "<f4")]},
        {"tensors": [TensorSpec("weight", (40, 70), "<f4"), TensorSpec("bias", (70,), "<f4")]},
        {"tensors": [TensorSpec("weights", (70, 40), "<f4"), TensorSpec("bias", (70,), "<f4")]},
        {"tensors": [TensorSpec("bias", (70,), "<f4"), TensorSpec("weight", (70, 40), "<f4")]},
    ],
    ids=["tile", "dtype", "shape", "name", "order"],
)
def test_digest_changes_with_any_part_of_the_plan(other: dict[str, object]) -> None:
    base = _linear_plan((32, 32))
    tensors = other.get("tensors", list(base.tensors))
    tile = other.get("tile", base.tile)

    changed = ShardPlan(tensors, tile)  # type: ignore[arg-type]

    assert changed.digest != base.digest
    assert changed != base


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        "null",
        "42",
        '"plan"',
        b"\xff\xfe",
        '{"format":2,"tile":[4,4],"tensors":[]}',
        '{"tile":[4,4],"tensors":[]}',
        '{"format":1,"tensors":[]}',
        '{"format":1,"tile":[4,4]}',
        '{"format":1,"tile":[4],"tensors":[]}',
        '{"format":1,"tile":["a","b"],"tensors":[]}',
        '{"format":1,"tile":[4,4],"tensors":[{"name":"w","shape":[2]}]}',
        '{"format":1,"tile":[4,4],"tensors":["w"]}',
        '{"format":1,"tile":[4,4],"tensors":[{"name":"w#1","shape":[2],"dtype":"<f4"}]}',
        '{"format":1,"tile":[4,4],"tensors":[{"name":"w","shape":["a"],"dtype":"<f4"}]}',
    ],
)
def test_malformed_json_is_a_shard_error(text: str | bytes) -> None:
    with pytest.raises(ShardError):
        ShardPlan.from_json(text)


def test_from_json_error_is_one_line() -> None:
    with pytest.raises(ShardError) as info:
        ShardPlan.from_json(json.dumps({"format": 1, "tile": [4, 4]}))

    assert "\n" not in str(info.value)
    assert "not a valid shard plan" in str(info.value)
