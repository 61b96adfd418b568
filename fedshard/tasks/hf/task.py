"""``fedshard.tasks.hf:sequence_classification``: fine-tune a Hugging Face model folder to classify texts.

Point ``task.options`` at a model folder and a labelled text table::

    task:
      target: fedshard.tasks.hf:sequence_classification
      options:
        model_dir: /models/my-bert              # a folder from save_pretrained (or package:NAME/PATH)
        data: /data/notes.csv                   # CSV with a header, or .jsonl
        text_column: text
        label_column: label
        labels: [negative, neutral, positive]   # the head's classes, in order

The table is cut once by a fixed shuffle (``data_seed``): a test split (``test_fraction``, or
every row of ``test_data``), a validation split (``validation_fraction``; score on it with
``score_on: validation`` to choose settings without touching the test split), and the training
pool (its first ``max_examples`` rows for a demo-sized run), which a simulated federation cuts
among its sites with label skew (``dirichlet_alpha``). Each site scores on an equal slice of
the scored split (the coordinator weighs the sites' scores by their training examples).

Everything is checked when the task is built, before a run writes anything: the folder is
whole and its tokenizer fits its model (:mod:`fedshard.tasks.hf.folder`), every label is one
of ``labels`` (:mod:`fedshard.tasks.hf.table`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.errors import TaskError
from fedshard.task import Metrics, Partition, TaskData, TrainSettings
from fedshard.tasks.hf.folder import ModelFolder, open_folder
from fedshard.tasks.hf.model import LoraSettings, Scheme, build_classifier
from fedshard.tasks.hf.table import Table, load_table
from fedshard.tasks.hf.training import Encoded, encode, fit, score
from fedshard.tasks.loop import adam, sgd
from fedshard.tasks.partition import dirichlet_partition

if TYPE_CHECKING:
    from torch import nn

__all__ = ["SequenceClassification", "sequence_classification"]


class SequenceClassification:
    """Text classification by LoRA fine-tuning of a local Hugging Face model (see the module docstring).

    Parameters
    ----------
    model_dir:
        The model folder (``config.json``, weights, tokenizer), or ``package:NAME/PATH``.
    data, test_data:
        The labelled table (CSV or JSON Lines); an optional separate test table.
    labels:
        The classifier head's classes, in order; every row's label must be one of them.
    text_column, label_column:
        The fields holding the text and its label.
    max_length:
        Tokens per text (longer texts are truncated).
    rank, lora_alpha, lora_dropout, targets, scheme:
        LoRA adapters (:class:`~fedshard.tasks.hf.model.LoraSettings`).
    test_fraction, validation_fraction, score_on:
        The held-out splits and which one ``evaluate`` scores (``test`` or ``validation``).
    max_examples:
        Train on only the first this many rows of the (shuffled) training pool.
    max_scored:
        Score on only the first this many rows of the (shuffled) scored split: a quicker,
        noisier score (the standard error of an accuracy p on n rows is sqrt(p(1-p)/n)).
    dirichlet_alpha, split_seed:
        Label skew of the sites' shares (smaller: more skewed) and its seed (default: the federation's).
    data_seed:
        The fixed shuffle that cuts the splits.
    drop_duplicates:
        Keep only the first row of each repeated text.
    physical_batch:
        The most texts one forward and backward pass holds: a larger batch (``training.batch_size:
        all``) is computed in pieces of this many and stepped once (memory, not the result).
    """

    def __init__(
        self,
        model_dir: str,
        data: str,
        labels: list[str],
        text_column: str = "text",
        label_column: str = "label",
        test_data: str | None = None,
        max_length: int = 128,
        rank: int = 8,
        lora_alpha: int = 16,
        lora_dropout: float = 0.0,
        targets: str | list[str] = "all-linear",
        scheme: str = Scheme.FFA,
        test_fraction: float = 0.15,
        validation_fraction: float = 0.0,
        score_on: str = "test",
        max_examples: int | None = None,
        max_scored: int | None = None,
        dirichlet_alpha: float = 1.0,
        split_seed: int | None = None,
        data_seed: int = 0,
        drop_duplicates: bool = False,
        physical_batch: int = 64,
    ) -> None:
        names = [str(label) for label in labels or []]
        if len(names) < 2 or len(set(names)) != len(names):
            raise TaskError(f"task.options.labels must list at least two distinct classes, got {labels!r}")
        if max_length < 2:
            raise TaskError(f"task.options.max_length must be >= 2, got {max_length}")
        if score_on not in ("test", "validation"):
            raise TaskError(f"task.options.score_on must be test or validation, got {score_on!r}")
        held_out = (0.0 if test_data else test_fraction) + validation_fraction
        if test_fraction < 0 or validation_fraction < 0 or held_out >= 1 or (not test_data and test_fraction == 0):
            raise TaskError(
                "task.options: test_fraction (> 0 without test_data) and validation_fraction (>= 0) "
                f"must leave rows to train on, got {test_fraction} and {validation_fraction}"
            )
        if score_on == "validation" and validation_fraction == 0:
            raise TaskError("task.options.score_on: validation needs validation_fraction > 0")
        for name, value in (("max_examples", max_examples), ("max_scored", max_scored)):
            if value is not None and value < 1:
                raise TaskError(f"task.options.{name} must be >= 1, got {value}")
        if dirichlet_alpha <= 0:
            raise TaskError(f"task.options.dirichlet_alpha must be > 0, got {dirichlet_alpha}")
        if physical_batch < 1:
            raise TaskError(f"task.options.physical_batch must be >= 1, got {physical_batch}")
        try:
            self.lora = LoraSettings(
                rank, lora_alpha, lora_dropout, tuple(targets) if isinstance(targets, list) else targets, Scheme(scheme)
            )
        except ValueError:
            raise TaskError(f"task.options.scheme must be one of {', '.join(Scheme)}, got {scheme!r}") from None
        self.labels = tuple(names)
        self.folder: ModelFolder = open_folder(model_dir)
        self.table = load_table(
            data, text_column=text_column, label_column=label_column, labels=names, drop_duplicates=drop_duplicates
        )
        self.test_table = (
            load_table(
                test_data,
                text_column=text_column,
                label_column=label_column,
                labels=names,
                what="task.options.test_data",
            )
            if test_data
            else None
        )
        self.max_length = max_length
        self.fractions = (0.0 if test_data else test_fraction, validation_fraction)
        self.score_on = score_on
        self.max_examples = max_examples
        self.max_scored = max_scored
        self.dirichlet_alpha = dirichlet_alpha
        self.split_seed = split_seed
        self.data_seed = data_seed
        self.physical_batch = physical_batch

    # the Task protocol ------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """The folder's model with a fresh head, frozen, under fresh LoRA adapters."""
        return build_classifier(self.folder, self.labels, self.lora)

    def splits(self) -> tuple[Table, Table, Table]:
        """(training pool, validation, test) of the table, by the fixed shuffle."""
        order = np.random.default_rng(self.data_seed).permutation(len(self.table))
        n_test, n_val = (int(f * len(order)) for f in self.fractions)
        test = self.test_table if self.test_table is not None else self.table.take(order[:n_test])
        validation = self.table.take(order[n_test : n_test + n_val])
        pool = order[n_test + n_val :]
        if self.max_examples is not None:
            pool = pool[: self.max_examples]
        return self.table.take(pool), validation, test

    def load_data(self, partition: Partition) -> TaskData:
        """This site's label-skewed share of the training pool and its slice of the scored split
        (all of both for ``index=None``: the central baseline)."""
        train, validation, test = self.splits()
        scored = validation if self.score_on == "validation" else test
        if self.max_scored is not None:
            scored = scored.take(np.arange(min(self.max_scored, len(scored))))
        if partition.index is not None:
            seed = partition.seed if self.split_seed is None else self.split_seed
            parts = dirichlet_partition(train.labels, partition.count, self.dirichlet_alpha, seed)
            train = train.take(parts[partition.index])
            scored = scored.take(np.array_split(np.arange(len(scored)), partition.count)[partition.index])
        tokenizer = self.folder.tokenizer
        return TaskData(
            train=encode(tokenizer, train.texts, train.labels, self.max_length),
            test=encode(tokenizer, scored.texts, scored.labels, self.max_length),
            num_train=len(train),
            num_test=len(scored),
        )

    def train(self, model: nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        """Adam on the adapters and the head; DP-SGD when the site's privacy asks for it, with plain
        SGD when its noise is shared with other sites' (one step, linear in the noise, whose shares
        add up in the aggregate: the server's optimiser then applies it)."""
        privacy = settings.privacy
        train: Encoded = data.train
        loss, _ = fit(
            model,
            train,
            settings.epochs,
            settings.batch_size,
            settings.learning_rate,
            settings.seed,
            privacy.make_private if privacy is not None else None,
            optimiser=sgd() if privacy is not None and privacy.distributed else adam,
            physical_batch=self.physical_batch,
        )
        return Metrics(num_examples=data.num_train, loss=loss)

    def evaluate(self, model: nn.Module, data: TaskData) -> Metrics:
        """Loss and accuracy on this site's slice of the scored split."""
        loss, accuracy = score(model, data.test)
        return Metrics(num_examples=data.num_test, loss=loss, accuracy=accuracy)


def sequence_classification(**options: Any) -> SequenceClassification:
    """``task.target: fedshard.tasks.hf:sequence_classification`` (options: see :class:`SequenceClassification`)."""
    return SequenceClassification(**options)
