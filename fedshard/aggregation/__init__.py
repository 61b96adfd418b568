"""Streaming aggregation of gradient shards: O(model) memory whatever the number of sites."""

from fedshard.aggregation._accumulator import (
    BLOCK_VALUES,
    FLOAT32_MAX_SITES,
    FLOAT32_SUM_TOLERANCE,
    ShardAccumulator,
    WeightedMean,
    all_finite,
    error_bound,
    sum_dtype,
)
from fedshard.aggregation._server_optimizer import ServerOptimizer
from fedshard.aggregation.bounds import extremes, fixed_weight_of, norm_scale, squared_norm, within
from fedshard.aggregation.server_rules import ServerRule

__all__ = [
    "BLOCK_VALUES",
    "FLOAT32_MAX_SITES",
    "FLOAT32_SUM_TOLERANCE",
    "ServerOptimizer",
    "ServerRule",
    "ShardAccumulator",
    "WeightedMean",
    "all_finite",
    "error_bound",
    "extremes",
    "fixed_weight_of",
    "norm_scale",
    "squared_norm",
    "sum_dtype",
    "within",
]
