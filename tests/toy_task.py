"""Tiny tasks for runtime tests: ``task``, a regression y = x·w* + noise partitioned by index, and
``silent``, records whose gradients are exactly zero (what DP-SGD releases is its noise alone)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedshard.task import Metrics, Partition, TaskData, TrainSettings


def _fit(net: nn.Module, opt: Any, loader: Any, epochs: int, loss_of: Callable[[Tensor, Tensor], Tensor]) -> float:
    """``epochs`` passes of ``loader`` minimising ``loss_of(x, y)``; the last batch's loss."""
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_of(xb, yb)
            loss.backward()
            opt.step()
    return float(loss.item())


class ToyTask:
    """Linear regression with a hidden layer; fast enough for many rounds in tests."""

    def __init__(
        self,
        examples: int = 40,
        hidden: int = 8,
        fail_partitions: tuple[int, ...] = (),
        crash_partition: int | None = None,
        batchnorm: bool = False,
    ) -> None:
        self.batchnorm = batchnorm
        self.examples = examples
        self.hidden = hidden
        self.fail_partitions = tuple(fail_partitions)
        self.crash_partition = crash_partition
        self._partition: int | None = None

    def build_model(self) -> nn.Module:
        norm: nn.Module = nn.BatchNorm1d(self.hidden) if self.batchnorm else nn.Identity()
        return nn.Sequential(nn.Linear(4, self.hidden), norm, nn.Tanh(), nn.Linear(self.hidden, 1))

    def load_data(self, partition: Partition) -> TaskData:
        self._partition = partition.index
        rng = np.random.default_rng(partition.seed)
        w = np.array([1.0, -2.0, 0.5, 3.0])
        n = self.examples * partition.count
        x = rng.normal(size=(n, 4)).astype(np.float32)
        y = (x @ w + 0.05 * rng.normal(size=n)).astype(np.float32)
        if partition.index is not None:
            idx = np.array_split(np.arange(n), partition.count)[partition.index]
            x, y = x[idx], y[idx]
        split = int(len(y) * 0.75)
        train = (torch.from_numpy(x[:split]), torch.from_numpy(y[:split]))
        test = (torch.from_numpy(x[split:]), torch.from_numpy(y[split:]))
        return TaskData(train=train, test=test, num_train=split, num_test=len(y) - split)

    def train(self, model: nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        if self._partition in self.fail_partitions:
            raise RuntimeError(f"partition {self._partition} is configured to fail")
        from torch.utils.data import DataLoader, TensorDataset

        x, y = data.train
        torch.manual_seed(settings.seed)
        loader: Any = DataLoader(TensorDataset(x, y), batch_size=settings.batch_size, shuffle=True)
        opt: Any = torch.optim.SGD(model.parameters(), lr=settings.learning_rate)
        net: nn.Module = model
        if settings.privacy is not None:
            net, opt, loader = settings.privacy.make_private(model, opt, loader)
        if self.crash_partition is not None and self._partition == self.crash_partition:
            os.kill(os.getpid(), signal.SIGKILL)  # a site process dying mid-round
        loss = _fit(net, opt, loader, settings.epochs, lambda xb, yb: nn.functional.mse_loss(net(xb).squeeze(1), yb))
        return Metrics(num_examples=len(y), loss=loss)

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        x, y = data.test
        with torch.no_grad():
            pred = model(x).squeeze(1)
            loss = nn.functional.mse_loss(pred, y).item()
            acc = float(((pred - y).abs() < 0.5).float().mean())
        return Metrics(num_examples=len(y), loss=loss, accuracy=acc)


task = ToyTask


class SilentTask:
    """Records whose gradients are all exactly zero (zero inputs, zero targets, a linear map
    without bias): whatever DP-SGD releases is its noise alone, so a round's aggregate is the
    sites' summed noise and nothing else."""

    def __init__(self, examples: int = 30, width: int = 16) -> None:
        self.examples = examples
        self.width = width

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.width, self.width, bias=False))

    def load_data(self, partition: Partition) -> TaskData:
        zeros = torch.zeros(self.examples, self.width)
        return TaskData(train=(zeros, zeros), test=(zeros[:2], zeros[:2]), num_train=self.examples, num_test=2)

    def train(self, model: nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        from torch.utils.data import DataLoader, TensorDataset

        x, y = data.train
        loader: Any = DataLoader(TensorDataset(x, y), batch_size=settings.batch_size)
        opt: Any = torch.optim.SGD(model.parameters(), lr=settings.learning_rate)
        net: nn.Module = model
        if settings.privacy is not None:
            net, opt, loader = settings.privacy.make_private(model, opt, loader)
        loss = _fit(net, opt, loader, settings.epochs, lambda xb, yb: nn.functional.mse_loss(net(xb), yb))
        return Metrics(num_examples=len(x), loss=loss)

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        x, y = data.test
        with torch.no_grad():
            loss = nn.functional.mse_loss(model(x), y).item()
        return Metrics(num_examples=len(x), loss=loss)


silent = SilentTask


def not_a_task() -> object:
    """A factory that returns something without the Task methods."""
    return object()
