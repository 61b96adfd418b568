"""The multilayer perceptron the tabular tasks build: ``Linear`` layers named ``fc1``, ``fc2``, … with
ReLUs (``act1``, …) between them, which DP-SGD (Opacus) trains as they are."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["mlp"]


def mlp(widths: Sequence[int]) -> nn.Sequential:
    """``widths[0]`` inputs → hidden widths… → ``widths[-1]`` outputs (one ``Linear``: logistic regression)."""
    from collections import OrderedDict

    from torch import nn

    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i, (a, b) in enumerate(itertools.pairwise(widths), start=1):
        layers[f"fc{i}"] = nn.Linear(a, b)
        if i < len(widths) - 1:
            layers[f"act{i}"] = nn.ReLU()
    return nn.Sequential(layers)
