"""Streaming aggregation of gradient shards: O(model) memory whatever the number of sites."""

from fedshard.aggregation.accumulator import BLOCK_VALUES, ShardAccumulator, WeightedMean, all_finite

__all__ = ["BLOCK_VALUES", "ShardAccumulator", "WeightedMean", "all_finite"]
