"""Wisconsin breast-cancer diagnosis (ships with scikit-learn: no download).

Hospitals hold non-IID slices: the data is sorted by one feature (mean radius by
default, which correlates with the diagnosis) and cut into contiguous partitions, so
each site sees a different mix of benign and malignant cases. A fixed, stratified
20 % of the data is the test set, partitioned the same way.

For repeated evaluation (``bench/dp_accuracy.py``) the test set can instead be one fold
of a shuffled, stratified k-fold split (``folds``, ``fold``, ``split_seed``), and for
tuning, ``validation_fraction`` replaces the test set by a stratified validation split
carved out of the training part, so choices made on it never see the test data.

Features are scaled with the per-feature minimum and maximum that the data set's
published description lists (``load_breast_cancer().DESCR``): public constants, so
no site's data leaks into another's preprocessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.tasks._classify import evaluate_classifier, train_epochs
from fedshard.task import Metrics, Partition, TaskData, TrainSettings
from fedshard.tasks.mlp import mlp

__all__ = ["BreastCancerTask", "task"]

# (min, max) per feature, from the data set's published summary statistics.
FEATURE_RANGES: tuple[tuple[float, float], ...] = (
    (6.981, 28.11),
    (9.71, 39.28),
    (43.79, 188.5),
    (143.5, 2501.0),
    (0.053, 0.163),
    (0.019, 0.345),
    (0.0, 0.427),
    (0.0, 0.201),
    (0.106, 0.304),
    (0.05, 0.097),
    (0.112, 2.873),
    (0.36, 4.885),
    (0.757, 21.98),
    (6.802, 542.2),
    (0.002, 0.031),
    (0.002, 0.135),
    (0.0, 0.396),
    (0.0, 0.053),
    (0.008, 0.079),
    (0.001, 0.03),
    (7.93, 36.04),
    (12.02, 49.54),
    (50.41, 251.2),
    (185.2, 4254.0),
    (0.071, 0.223),
    (0.027, 1.058),
    (0.0, 1.252),
    (0.0, 0.291),
    (0.156, 0.664),
    (0.055, 0.208),
)


@dataclass(frozen=True)
class _Split:
    x: torch.Tensor
    y: torch.Tensor


class BreastCancerTask:
    """A small MLP classifier on the breast-cancer data.

    Parameters
    ----------
    hidden:
        Widths of the hidden layers.
    sort_feature:
        Index of the feature the data is sorted by before partitioning (non-IID).
    test_fraction:
        Share of the data held out for testing (ignored when ``folds`` is set).
    folds:
        When set, the test set is fold ``fold`` of a shuffled, stratified ``folds``-fold
        split instead of a ``test_fraction`` hold-out.
    fold:
        Which fold is the test set (0 ≤ fold < folds).
    split_seed:
        Seed of the test split (and of the validation split); default: the federation seed.
    validation_fraction:
        When > 0, a stratified share of the *training* part becomes the "test" set that
        ``evaluate`` scores (for tuning); the real test set is then not loaded at all.
    momentum:
        Momentum of the local SGD optimiser.
    features:
        Indices of the features the model sees (default: all 30). A smaller input means
        fewer parameters, hence less DP noise in total.
    """

    def __init__(
        self,
        hidden: tuple[int, ...] | list[int] = (64, 32),
        sort_feature: int = 0,
        test_fraction: float = 0.2,
        folds: int | None = None,
        fold: int = 0,
        split_seed: int | None = None,
        validation_fraction: float = 0.0,
        momentum: float = 0.9,
        features: Sequence[int] | None = None,
    ) -> None:
        if folds is not None and not (folds >= 2 and 0 <= fold < folds):
            raise ValueError(f"need folds >= 2 and 0 <= fold < folds, got folds={folds}, fold={fold}")
        if not 0.0 <= validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
        self.hidden = tuple(int(h) for h in hidden)
        self.sort_feature = sort_feature
        self.test_fraction = test_fraction
        self.folds = folds
        self.fold = fold
        self.split_seed = split_seed
        self.validation_fraction = validation_fraction
        self.momentum = momentum
        self.features = None if features is None else tuple(int(f) for f in features)
        if self.features is not None and not (self.features and all(0 <= f < 30 for f in self.features)):
            raise ValueError(f"features must be indices in [0, 30), got {features}")

    def build_model(self) -> nn.Module:
        """MLP inputs (30) → hidden… → 2, with layers named ``fc1``, ``fc2``, …"""
        inputs = 30 if self.features is None else len(self.features)
        return mlp((inputs, *self.hidden, 2))

    def load_data(self, partition: Partition) -> TaskData:
        """This partition's train and test slices (all of them for ``index=None``)."""
        from sklearn.datasets import load_breast_cancer
        from sklearn.model_selection import StratifiedKFold, train_test_split

        x, y = load_breast_cancer(return_X_y=True)
        lo = np.array([r[0] for r in FEATURE_RANGES])
        hi = np.array([r[1] for r in FEATURE_RANGES])
        x = np.clip((x - lo) / (hi - lo), 0.0, 1.0) * 2.0 - 1.0
        seed = partition.seed if self.split_seed is None else self.split_seed
        if self.folds is None:
            x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=self.test_fraction, stratify=y, random_state=seed)
        else:
            kfold = StratifiedKFold(n_splits=self.folds, shuffle=True, random_state=seed)
            tr, te = list(kfold.split(x, y))[self.fold]
            x_tr, x_te, y_tr, y_te = x[tr], x[te], y[tr], y[te]
        if self.validation_fraction > 0:
            x_tr, x_te, y_tr, y_te = train_test_split(
                x_tr, y_tr, test_size=self.validation_fraction, stratify=y_tr, random_state=seed
            )
        train = self._slice(x_tr, y_tr, partition)
        test = self._slice(x_te, y_te, partition)
        return TaskData(train=train, test=test, num_train=len(train.y), num_test=len(test.y))

    def _slice(self, x: np.ndarray, y: np.ndarray, partition: Partition) -> _Split:
        order = np.argsort(x[:, self.sort_feature], kind="stable")
        if partition.index is not None:
            order = np.array_split(order, partition.count)[partition.index]
        x = x[order] if self.features is None else x[order][:, list(self.features)]
        return _Split(torch.tensor(x, dtype=torch.float32), torch.tensor(y[order], dtype=torch.long))

    def train(self, model: nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        """Mini-batch SGD with momentum on the local training slice (DP-SGD when asked)."""
        from torch.utils.data import DataLoader, TensorDataset

        split: _Split = data.train
        generator = torch.Generator().manual_seed(settings.seed)
        loader: Any = DataLoader(
            TensorDataset(split.x, split.y), batch_size=settings.batch_size, shuffle=True, generator=generator
        )
        optimiser: Any = torch.optim.SGD(model.parameters(), lr=settings.learning_rate, momentum=self.momentum)
        net: nn.Module = model
        if settings.privacy is not None:
            net, optimiser, loader = settings.privacy.make_private(model, optimiser, loader)
        loss = train_epochs(net, optimiser, lambda: loader, settings.epochs)
        return Metrics(num_examples=len(split.y), loss=loss)

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        """Loss and accuracy on the local test slice."""
        split: _Split = data.test
        return evaluate_classifier(model, split.x, split.y)


task = BreastCancerTask
"""Default factory: ``task.target: clients.tasks.breast_cancer:task``."""
