"""Streaming aggregation of gradient shards: O(model) memory whatever the number of sites."""

from fedshard.aggregation.accumulator import BLOCK_VALUES, ShardAccumulator, WeightedMean, all_finite
from fedshard.aggregation.bounds import extremes, fixed_weight_of, norm_scale, squared_norm, within
from fedshard.aggregation.server_optimizer import ServerOptimizer, ServerOptimizerKind

__all__ = [
    "BLOCK_VALUES",
    "ServerOptimizer",
    "ServerOptimizerKind",
    "ShardAccumulator",
    "WeightedMean",
    "all_finite",
    "extremes",
    "fixed_weight_of",
    "norm_scale",
    "squared_norm",
    "within",
]
