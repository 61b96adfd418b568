"""Tokenised examples, and how a sequence-classification task's batches reach the shared loops
(:mod:`fedshard.tasks.loop`).

Every text is tokenised once, truncated to ``max_length`` and padded to it; each batch is cut
to its longest row before the model sees it (tweets average about 30 tokens: a batch costs
what its texts need, not ``max_length``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.tasks.loop import Optimiser, adam
from fedshard.tasks.loop import fit as fit_loop
from fedshard.tasks.loop import score as score_tensors

if TYPE_CHECKING:
    import torch
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


def fit(
    model: nn.Module,
    data: Encoded,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    make_private: Callable[[Any, Any, Any], tuple[Any, Any, Any]] | None = None,
    after_epoch: Callable[[int], bool] | None = None,
    optimiser: Optimiser = adam,
    physical_batch: int | None = None,
) -> tuple[float, int]:
    """``optimiser`` (Adam) on the model's trainable tensors (DP-SGD through ``make_private`` when
    given; ``after_epoch``, ``physical_batch``: see :func:`~fedshard.tasks.loop.fit`); returns (mean
    training loss, examples seen)."""
    return fit_loop(
        model,
        _tensors(data),
        _logits,
        epochs,
        batch_size,
        learning_rate,
        seed,
        make_private,
        after_epoch,
        optimiser,
        physical_batch,
    )


def score(model: nn.Module, data: Encoded, batch_size: int = 128) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on ``data``."""
    return score_tensors(model, _tensors(data), _logits, batch_size)


def _tensors(data: Encoded) -> tuple[torch.Tensor, ...]:
    import torch

    return tuple(torch.from_numpy(a) for a in (data.input_ids, data.attention_mask, data.labels))


def _logits(net: Any, inputs: Any) -> torch.Tensor:
    """The model's logits on a batch cut to its longest row."""
    ids, mask = inputs
    width = max(int(mask.sum(1).max()), 1)
    return net(input_ids=ids[:, :width], attention_mask=mask[:, :width]).logits  # type: ignore[no-any-return]
