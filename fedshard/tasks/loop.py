"""The training and scoring loops fedshard's tasks share: an optimiser (Adam by default; DP-SGD
through a site's ``make_private``) over shuffled batches, cross-entropy, and a scoring pass; a
task says only how a batch's inputs become logits.

A batch is a tuple of tensors with the labels last; ``logits(net, inputs)`` runs the model on
the others (``net`` is the model, or the DP wrapper ``make_private`` returned).

A batch larger than ``physical_batch`` is computed in pieces of at most that many rows and
stepped once, as one batch (memory, not the result: a piece's activations, not the batch's; under
DP-SGD Opacus's ``BatchMemoryManager`` clips every row and adds the noise once per batch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["Logits", "Optimiser", "adam", "fit", "score", "sgd"]

Logits = Callable[[Any, Sequence["torch.Tensor"]], "torch.Tensor"]
"""``(net, the batch's input tensors) → logits``."""

Optimiser = Callable[[list[Any], float], Any]
"""``(trainable parameters, learning rate) → a torch optimiser``."""


def adam(params: list[Any], learning_rate: float) -> Any:
    """torch's Adam (the default)."""
    import torch

    return torch.optim.Adam(params, lr=learning_rate)


def sgd(momentum: float = 0.0) -> Optimiser:
    """torch's SGD with ``momentum`` (plain SGD, as distributed DP noise needs, at 0)."""

    def make(params: list[Any], learning_rate: float) -> Any:
        import torch

        return torch.optim.SGD(params, lr=learning_rate, momentum=momentum)

    return make


def fit(
    model: nn.Module,
    tensors: Sequence[torch.Tensor],
    logits: Logits,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    make_private: Callable[[Any, Any, Any], tuple[Any, Any, Any]] | None = None,
    after_epoch: Callable[[int], bool] | None = None,
    optimiser: Optimiser = adam,
    physical_batch: int | None = None,
) -> tuple[float, int]:
    """``optimiser`` (Adam) on ``model``'s trainable tensors over ``tensors`` (labels last), shuffled
    by ``seed``; DP-SGD when ``make_private`` is given. ``after_epoch(epoch)`` (1, 2, …), when given, is
    called after each epoch and stops the training by returning True (early stopping: the
    optimiser's state carries over between epochs). A batch above ``physical_batch`` rows is
    computed in pieces (see the module docstring). Returns (mean training loss, examples seen)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    generator = torch.Generator().manual_seed(seed)
    loader: Any = DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=True, generator=generator)
    step: Any = optimiser(params, learning_rate)
    net: Any = model
    if make_private is not None:
        net, step, loader = make_private(model, step, loader)
    pieces = physical_batch if physical_batch is not None and batch_size > physical_batch else None
    loss_fn = torch.nn.CrossEntropyLoss()
    net.train()
    total, count = 0.0, 0
    for epoch in range(1, epochs + 1):
        # under DP-SGD Opacus cuts the batches (its optimiser steps once per batch); else this loop does
        with _physical(loader, step, pieces if make_private is not None else None) as batches:
            for *inputs, labels in batches:
                if len(labels) == 0:  # Poisson sampling (DP-SGD) can draw an empty batch
                    continue
                step.zero_grad()
                total += _backward(net, logits, loss_fn, inputs, labels, pieces if make_private is None else None)
                step.step()
                count += len(labels)
        if after_epoch is not None and after_epoch(epoch):
            break
        net.train()  # after_epoch may have scored the model
    return total / max(count, 1), count


def _backward(net: Any, logits: Logits, loss_fn: Any, inputs: list[Any], labels: Any, pieces: int | None) -> float:
    """The batch's gradient, computed ``pieces`` rows at a time (each piece's mean loss weighed by its
    share of the batch; all at once for None); returns the batch's summed loss."""
    size = pieces or len(labels)
    total = 0.0
    for start in range(0, len(labels), size):
        piece = slice(start, start + size)
        loss = loss_fn(logits(net, [t[piece] for t in inputs]), labels[piece])
        (loss if size == len(labels) else loss * (len(labels[piece]) / len(labels))).backward()
        total += loss.item() * len(labels[piece])
    return total


@contextlib.contextmanager
def _physical(loader: Any, step: Any, physical_batch: int | None) -> Iterator[Any]:
    """``loader``, or under DP-SGD with ``physical_batch``, Opacus's pieces of its batches (each
    piece's ``step`` clips and accumulates; the batch's last adds the noise and steps)."""
    if physical_batch is None:
        yield loader
        return
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=physical_batch, optimizer=step) as pieces:
        yield pieces


def score(model: nn.Module, tensors: Sequence[torch.Tensor], logits: Logits, batch_size: int) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on ``tensors`` (labels last), in order."""
    import torch

    model.eval()
    n = len(tensors[-1])
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            *inputs, labels = (t[start : start + batch_size] for t in tensors)
            out = logits(model, inputs)
            loss += float(torch.nn.functional.cross_entropy(out, labels, reduction="sum"))
            correct += int((out.argmax(1) == labels).sum())
    return loss / max(n, 1), correct / max(n, 1)
