"""A tiny regression task for runtime tests: y = x·w* + noise, partitioned by index."""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import torch
from torch import nn

from fedshard.task import Metrics, Partition, TaskData, TrainSettings


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
        loss = torch.tensor(0.0)
        for _ in range(settings.epochs):
            for xb, yb in loader:
                opt.zero_grad()
                loss = nn.functional.mse_loss(net(xb).squeeze(1), yb)
                loss.backward()
                opt.step()
        return Metrics(num_examples=len(y), loss=loss.item())

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        x, y = data.test
        with torch.no_grad():
            pred = model(x).squeeze(1)
            loss = nn.functional.mse_loss(pred, y).item()
            acc = float(((pred - y).abs() < 0.5).float().mean())
        return Metrics(num_examples=len(y), loss=loss, accuracy=acc)


task = ToyTask


def not_a_task() -> object:
    """A factory that returns something without the Task methods."""
    return object()
