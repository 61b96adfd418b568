"""Shard plans: cutting model tensors into stable, addressable shards."""

from fedshard.sharding.plan import DEFAULT_TILE, ShardPlan, ShardSpec, TensorSpec, as_numpy

__all__ = ["DEFAULT_TILE", "ShardPlan", "ShardSpec", "TensorSpec", "as_numpy"]
