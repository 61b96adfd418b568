"""A seeded synthetic classification task that scales to any number of sites.

Every site's data is generated from the federation seed and its own partition index
alone, so a site loads its few examples in microseconds whatever the number of sites
(no shared data set is built and sliced), and 10,000 sites need no more memory than
their own examples. The labels come from one fixed "teacher" (a random two-layer
network drawn from ``task_seed``), so a model can learn them; each site's inputs are
shifted by an offset of its own (non-IID sites), so the federation must learn from
all of them. The centrally trained baseline (``Partition(index=None)``) sees the
union of every site's examples.

Meant for scale studies (``bench/scale.py``) and quick experiments; its numbers say
nothing about any real data set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.tasks._classify import evaluate_classifier, train_epochs
from fedshard.task import Metrics, Partition, TaskData, TrainSettings
from fedshard.tasks.mlp import mlp

__all__ = ["SyntheticTask", "task"]


@dataclass(frozen=True)
class _Split:
    x: torch.Tensor
    y: torch.Tensor


class SyntheticTask:
    """An MLP classifier on seeded synthetic tabular data.

    Parameters
    ----------
    features:
        Input features per example.
    classes:
        Number of classes.
    hidden:
        Widths of the model's hidden layers (layers named ``fc1``, ``fc2``, …).
    train_per_site, test_per_site:
        Examples each site holds for training and for testing.
    site_shift:
        Scale of each site's input offset (0: IID sites).
    label_noise:
        Share of labels replaced by a random class.
    task_seed:
        Seed of the teacher that labels the data (fixed across federations by default).
    """

    def __init__(
        self,
        features: int = 7,
        classes: int = 2,
        hidden: tuple[int, ...] | list[int] = (16,),
        train_per_site: int = 6,
        test_per_site: int = 2,
        site_shift: float = 0.5,
        label_noise: float = 0.05,
        task_seed: int = 0,
    ) -> None:
        if features < 1 or classes < 2 or train_per_site < 1 or test_per_site < 0:
            raise ValueError(
                "need features >= 1, classes >= 2, train_per_site >= 1 and test_per_site >= 0, got "
                f"{features}, {classes}, {train_per_site}, {test_per_site}"
            )
        if not 0.0 <= label_noise < 1.0:
            raise ValueError(f"label_noise must be in [0, 1), got {label_noise}")
        self.features = features
        self.classes = classes
        self.hidden = tuple(int(h) for h in hidden)
        self.train_per_site = train_per_site
        self.test_per_site = test_per_site
        self.site_shift = site_shift
        self.label_noise = label_noise
        teacher = np.random.default_rng(task_seed)
        self._w1 = teacher.normal(size=(features, 4 * classes))
        self._w2 = teacher.normal(size=(4 * classes, classes))

    def build_model(self) -> nn.Module:
        """MLP features → hidden… → classes."""
        return mlp((self.features, *self.hidden, self.classes))

    def load_data(self, partition: Partition) -> TaskData:
        """This site's examples (every site's, for ``index=None``)."""
        indices = range(partition.count) if partition.index is None else (partition.index,)
        parts = [self._site_examples(partition.seed, i) for i in indices]
        train = _Split(torch.cat([p[0].x for p in parts]), torch.cat([p[0].y for p in parts]))
        test = _Split(torch.cat([p[1].x for p in parts]), torch.cat([p[1].y for p in parts]))
        return TaskData(train=train, test=test, num_train=len(train.y), num_test=len(test.y))

    def _site_examples(self, seed: int, index: int) -> tuple[_Split, _Split]:
        rng = np.random.default_rng((seed, index))
        offset = rng.normal(scale=self.site_shift, size=self.features)
        n = self.train_per_site + self.test_per_site
        x = rng.normal(size=(n, self.features)) + offset
        y = (np.maximum(x @ self._w1, 0.0) @ self._w2).argmax(axis=1)
        noisy = rng.random(n) < self.label_noise
        y[noisy] = rng.integers(0, self.classes, size=int(noisy.sum()))
        xt = torch.tensor(x, dtype=torch.float32)
        yt = torch.tensor(y, dtype=torch.long)
        k = self.train_per_site
        return _Split(xt[:k], yt[:k]), _Split(xt[k:], yt[k:])

    def train(self, model: nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        """Mini-batch SGD on the local training examples (DP-SGD when asked)."""
        from torch.utils.data import DataLoader, TensorDataset

        split: _Split = data.train
        optimiser: Any = torch.optim.SGD(model.parameters(), lr=settings.learning_rate)
        generator = torch.Generator().manual_seed(settings.seed)
        if settings.privacy is not None:
            loader: Any = DataLoader(
                TensorDataset(split.x, split.y), batch_size=settings.batch_size, shuffle=True, generator=generator
            )
            net, optimiser, loader = settings.privacy.make_private(model, optimiser, loader)
            loss = train_epochs(net, optimiser, lambda: loader, settings.epochs)
        else:  # a few examples: batch by hand (a DataLoader costs more than the step)

            def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
                order = torch.randperm(len(split.y), generator=generator)
                cuts = [order[i : i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]
                return [(split.x[c], split.y[c]) for c in cuts]

            loss = train_epochs(model, optimiser, batches, settings.epochs)
        return Metrics(num_examples=len(split.y), loss=loss)

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        """Loss and accuracy on the local test examples."""
        split: _Split = data.test
        return evaluate_classifier(model, split.x, split.y)


task = SyntheticTask
"""Default factory: ``task.target: clients.tasks.synthetic:task``."""
