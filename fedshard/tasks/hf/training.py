"""Tokenised examples, and the training and scoring loops of a sequence-classification task.

Every text is tokenised once, truncated to ``max_length`` and padded to it; each batch is cut
to its longest row before the model sees it (tweets average about 30 tokens: a batch costs
what its texts need, not ``max_length``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Encoded", "encode", "fit", "score"]


@dataclass(frozen=True, slots=True)
class Encoded:
    """Token ids and attention masks ``(n, max_length)`` (int64) and labels ``(n,)``."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def encode(tokenizer: Any, texts: tuple[str, ...], labels: np.ndarray, max_length: int) -> Encoded:
    """``texts`` tokenised by ``tokenizer`` (truncated and padded to ``max_length``)."""
    out = tokenizer(list(texts), truncation=True, max_length=max_length, padding="max_length", return_tensors="np")
    return Encoded(
        np.ascontiguousarray(out["input_ids"], dtype=np.int64),
        np.ascontiguousarray(out["attention_mask"], dtype=np.int64),
        np.ascontiguousarray(labels, dtype=np.int64),
    )


def _trimmed(ids: Any, mask: Any) -> tuple[Any, Any]:
    width = max(int(mask.sum(1).max()), 1)
    return ids[:, :width], mask[:, :width]


def fit(
    model: nn.Module,
    data: Encoded,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    make_private: Callable[[Any, Any, Any], tuple[Any, Any, Any]] | None = None,
) -> tuple[float, int]:
    """Adam on the model's trainable tensors (DP-SGD through ``make_private`` when given);
    returns (mean training loss, examples seen)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    dataset = TensorDataset(
        torch.from_numpy(data.input_ids), torch.from_numpy(data.attention_mask), torch.from_numpy(data.labels)
    )
    generator = torch.Generator().manual_seed(seed)
    loader: Any = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator)
    optimiser: Any = torch.optim.Adam(params, lr=learning_rate)
    net: Any = model
    if make_private is not None:
        net, optimiser, loader = make_private(model, optimiser, loader)
    loss_fn = torch.nn.CrossEntropyLoss()
    net.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        for ids, mask, labels in loader:
            if len(labels) == 0:  # Poisson sampling (DP-SGD) can draw an empty batch
                continue
            ids, mask = _trimmed(ids, mask)
            optimiser.zero_grad()
            loss = loss_fn(net(input_ids=ids, attention_mask=mask).logits, labels)
            loss.backward()
            optimiser.step()
            total += loss.item() * len(labels)
            count += len(labels)
    return total / max(count, 1), count


def score(model: nn.Module, data: Encoded, batch_size: int = 128) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on ``data``."""
    import torch

    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            ids, mask = _trimmed(
                torch.from_numpy(data.input_ids[start : start + batch_size]),
                torch.from_numpy(data.attention_mask[start : start + batch_size]),
            )
            labels = torch.from_numpy(data.labels[start : start + batch_size])
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(1) == labels).sum())
    n = max(len(data), 1)
    return loss / n, correct / n
