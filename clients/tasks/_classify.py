"""What the example classification tasks share: the training loop over mini-batches and the
evaluation of a classifier's logits."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from fedshard.task import Metrics

__all__ = ["evaluate_classifier", "train_epochs"]


def train_epochs(
    net: nn.Module, optimiser: Any, batches: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]], epochs: int
) -> float:
    """Cross-entropy training of ``net`` for ``epochs`` passes over ``batches()``; the mean loss per example."""
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        for xb, yb in batches():
            optimiser.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            optimiser.step()
            total += loss.item() * len(yb)
            count += len(yb)
    return total / max(count, 1)


def evaluate_classifier(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Metrics:
    """Loss and accuracy of ``model``'s logits on ``x`` against labels ``y``."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = float(nn.functional.cross_entropy(logits, y)) if len(y) else 0.0
        correct = int((logits.argmax(dim=1) == y).sum())
    return Metrics(num_examples=len(y), loss=loss, accuracy=correct / max(len(y), 1))
