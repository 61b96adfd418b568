"""``fedshard.tasks.tabular:classification``: an outcome predicted from a table of records.

Point ``task.options`` at a table (CSV with a header, or JSON Lines) whose rows are records
(patients, claims) and one column is the outcome::

    task:
      target: fedshard.tasks.tabular:classification
      options:
        data: /data/cohort.csv
        label_column: died_within_1y
        labels: ["0", "1"]          # the classes, in order; every row's label is one of them
        exclude: [patient_id]       # columns the model must not see (identifiers, follow-up time)
        ranges: {age: [0, 120]}     # public bounds each numeric column is scaled by (see columns.py)

Every other column is an input: numbers scaled to [-1, 1], categories one-hot
(:mod:`fedshard.tasks.tabular.columns`). The model is logistic regression (``hidden: []``, the
default: few parameters, so little DP noise in total) or an MLP (``hidden: [64, 32]``),
trained by SGD, through DP-SGD when the site's privacy asks for it.

The test set is one fold of a stratified, shuffled ``folds``-fold split (``fold``,
``split_seed``); ``validation_fraction`` carves a stratified validation split out of the
training part, which ``evaluate`` then scores instead (the test fold is not even read), to
choose settings without touching the test data. A simulated federation cuts the training
part among its sites with label skew (``dirichlet_alpha``), and each site scores an equal
slice of the scored split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.errors import TaskError
from fedshard.task import Metrics, Partition, TaskData, TrainSettings
from fedshard.tasks.files import read_rows
from fedshard.tasks.loop import fit, score, sgd
from fedshard.tasks.mlp import mlp
from fedshard.tasks.partition import dirichlet_partition
from fedshard.tasks.tabular.columns import Encoding

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["Classification", "classification"]


@dataclass(frozen=True, slots=True)
class Records:
    """Encoded inputs ``(n, width)`` float32 and class indices ``(n,)`` int64."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def take(self, index: np.ndarray) -> Records:
        """The records at ``index``."""
        return Records(self.x[index], self.y[index])


class Classification:
    """Classify records of a table (see the module docstring).

    Parameters
    ----------
    data:
        The table (CSV or JSON Lines; a path or ``package:NAME/PATH``).
    label_column, labels:
        The outcome's column and its classes, in order (compared as text).
    features, exclude:
        The input columns (default: every column but the label and ``exclude``).
    categorical, ranges:
        How columns are encoded (:class:`~fedshard.tasks.tabular.columns.Encoding`).
    hidden:
        Hidden layer widths (``[]``: logistic regression).
    momentum:
        SGD momentum (0: plain SGD, as distributed DP noise needs).
    folds, fold, split_seed:
        The test fold of a stratified k-fold split and its seed (default: the federation's).
    validation_fraction:
        Score a validation split of the training part instead of the test fold.
    dirichlet_alpha:
        Label skew of the sites' shares in a simulation (smaller: more skewed).
    """

    def __init__(
        self,
        data: str,
        label_column: str,
        labels: list[str],
        features: list[str] | None = None,
        exclude: list[str] | None = None,
        categorical: list[str] | dict[str, list[str]] | None = None,
        ranges: dict[str, list[float]] | None = None,
        hidden: list[int] | None = None,
        momentum: float = 0.0,
        folds: int = 5,
        fold: int = 0,
        split_seed: int | None = None,
        validation_fraction: float = 0.0,
        dirichlet_alpha: float = 1.0,
    ) -> None:
        names = [str(label) for label in labels or []]
        if len(names) < 2 or len(set(names)) != len(names):
            raise TaskError(f"task.options.labels must list at least two distinct classes, got {labels!r}")
        if not (folds >= 2 and 0 <= fold < folds):
            raise TaskError(f"task.options: need folds >= 2 and 0 <= fold < folds, got folds={folds}, fold={fold}")
        if not 0.0 <= validation_fraction < 1.0:
            raise TaskError(f"task.options.validation_fraction must be in [0, 1), got {validation_fraction}")
        if dirichlet_alpha <= 0:
            raise TaskError(f"task.options.dirichlet_alpha must be > 0, got {dirichlet_alpha}")
        if any(int(h) < 1 for h in hidden or []):
            raise TaskError(f"task.options.hidden must list positive widths, got {hidden!r}")
        rows = [row for _, row in read_rows(data, "task.options.data")]
        if not rows:
            raise TaskError(f"task.options.data {data}: no rows")
        header = list(rows[0])
        left_out = {label_column, *(exclude or [])}
        chosen = list(features) if features is not None else [c for c in header if c not in left_out]
        unknown = [c for c in [label_column, *chosen, *(exclude or [])] if c not in header]
        if unknown:
            raise TaskError(f"task.options.data {data}: no column {unknown[0]!r} (it has: {', '.join(header)})")
        if label_column in chosen:
            raise TaskError(f"task.options.features: {label_column!r} is the label; the model must not see it")
        if not chosen:
            raise TaskError("task.options: no input column is left (features, exclude)")
        self.labels = tuple(names)
        self.encoding = Encoding.of(rows, chosen, categorical, ranges)
        self.records = Records(self.encoding.encode(rows), _label_ids(rows, label_column, names))
        self.hidden = tuple(int(h) for h in hidden or [])
        self.momentum = momentum
        self.folds, self.fold, self.split_seed = folds, fold, split_seed
        self.validation_fraction = validation_fraction
        self.dirichlet_alpha = dirichlet_alpha

    # the Task protocol ------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """Inputs → hidden… → classes (:func:`fedshard.tasks.mlp.mlp`; DP-SGD trains it)."""
        return mlp((self.encoding.width, *self.hidden, len(self.labels)))

    def splits(self, seed: int) -> tuple[Records, Records]:
        """(training part, scored split): the test fold, or the validation split when asked."""
        from sklearn.model_selection import StratifiedKFold, train_test_split

        y = self.records.y
        kfold = StratifiedKFold(n_splits=self.folds, shuffle=True, random_state=seed)
        train, test = list(kfold.split(np.zeros(len(y)), y))[self.fold]
        if self.validation_fraction > 0:
            train, test = train_test_split(
                train, test_size=self.validation_fraction, stratify=y[train], random_state=seed
            )
        return self.records.take(np.sort(train)), self.records.take(np.sort(test))

    def load_data(self, partition: Partition) -> TaskData:
        """This site's label-skewed share of the training part and its slice of the scored split
        (all of both for ``index=None``: the central baseline)."""
        seed = partition.seed if self.split_seed is None else self.split_seed
        train, scored = self.splits(seed)
        if partition.index is not None:
            parts = dirichlet_partition(train.y, partition.count, self.dirichlet_alpha, partition.seed)
            train = train.take(parts[partition.index])
            scored = scored.take(np.array_split(np.arange(len(scored)), partition.count)[partition.index])
        return TaskData(train=train, test=scored, num_train=len(train), num_test=len(scored))

    def train(self, model: nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        """SGD on the site's records (DP-SGD when the site's privacy asks for it)."""
        make_private = settings.privacy.make_private if settings.privacy is not None else None
        records: Records = data.train
        loss, _ = fit(
            model,
            _tensors(records),
            _logits,
            settings.epochs,
            settings.batch_size,
            settings.learning_rate,
            settings.seed,
            make_private,
            optimiser=sgd(self.momentum),
        )
        return Metrics(num_examples=data.num_train, loss=loss)

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        """Loss and accuracy on this site's slice of the scored split."""
        loss, accuracy = score(model, _tensors(data.test), _logits, batch_size=4096)
        return Metrics(num_examples=data.num_test, loss=loss, accuracy=accuracy)


def _label_ids(rows: Sequence[Mapping[str, object]], column: str, names: list[str]) -> np.ndarray:
    index = {name: i for i, name in enumerate(names)}
    ids = []
    for number, row in enumerate(rows, start=1):
        label = str(row.get(column, "")).strip()
        if label not in index:
            raise TaskError(
                f"task.options.data: row {number}'s {column} {label!r} is not one of task.options.labels "
                f"({', '.join(names)})"
            )
        ids.append(index[label])
    return np.array(ids, dtype=np.int64)


def _tensors(records: Records) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    return torch.from_numpy(records.x), torch.from_numpy(records.y)


def _logits(net: Any, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    return net(inputs[0])  # type: ignore[no-any-return]


def classification(**options: Any) -> Classification:
    """``task.target: fedshard.tasks.tabular:classification`` (options: see :class:`Classification`)."""
    return Classification(**options)
