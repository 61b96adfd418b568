"""How a table's columns become a model's inputs: numbers scaled to [-1, 1], categories one-hot.

A **numeric** column is scaled by a range ``[low, high]`` to ``[-1, 1]`` (values outside are
clipped). Give the ranges (``ranges``) where the sites hold different tables: every site must
scale alike, and public bounds (a lab value's reportable range, an age's 0-120) reveal nothing
about any site's patients. A column without a given range takes the smallest and largest value
of the table the task reads: right in a simulation, where every site reads the same table.

A **categorical** column becomes one input per category (1 for the row's, 0 elsewhere). A
column is categorical when it is listed in ``categorical`` (with its categories, or with the
table's when given as a list of names) or when any of its values is not a number. A value
outside a column's declared categories is refused in one line, as is an empty value or text
in a numeric column: a table is never half-read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedshard.errors import TaskError

__all__ = ["Column", "Encoding", "MISSING"]

MISSING = frozenset({"", "na", "nan", "null", "none"})
"""Values (case-insensitive) read as missing."""


@dataclass(frozen=True, slots=True)
class Column:
    """One input column: numeric (``categories`` None) scaled by ``[low, high]``, or one-hot."""

    name: str
    categories: tuple[str, ...] | None = None
    low: float = 0.0
    high: float = 1.0

    @property
    def width(self) -> int:
        """The inputs it becomes."""
        return 1 if self.categories is None else len(self.categories)


@dataclass(frozen=True, slots=True)
class Encoding:
    """The columns a model sees, in order, and how each is encoded."""

    columns: tuple[Column, ...]
    what: str = "task.options.data"

    @property
    def width(self) -> int:
        """The model's number of inputs."""
        return sum(c.width for c in self.columns)

    @classmethod
    def of(
        cls,
        rows: Sequence[Mapping[str, object]],
        features: Sequence[str],
        categorical: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
        ranges: Mapping[str, Sequence[float]] | None = None,
        what: str = "task.options.data",
    ) -> Encoding:
        """The encoding of ``features`` for ``rows`` (see the module docstring).

        Raises
        ------
        TaskError
            A range that is not ``[low, high]`` with low < high, a range for a categorical
            column, or a missing value.
        """
        declared = dict(categorical) if isinstance(categorical, Mapping) else dict.fromkeys(categorical or (), None)
        given = dict(ranges or {})
        columns = []
        for name in features:
            values = [_text(row, name, number, what) for number, row in enumerate(rows, start=1)]
            if name in declared or not all(_is_number(v) for v in values):
                if name in given:
                    raise TaskError(f"task.options.ranges.{name}: {name} is categorical (its values are not numbers)")
                listed = declared.get(name)
                categories = tuple(str(c) for c in listed) if listed else tuple(sorted(set(values)))
                columns.append(Column(name, categories))
                continue
            if name in given:
                low, high = _range(name, given[name])
            else:
                numbers = [float(v) for v in values]
                low, high = min(numbers), max(numbers)
            columns.append(Column(name, None, low, high))
        return cls(tuple(columns), what)

    def encode(self, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
        """``rows`` as a ``(len(rows), width)`` float32 array.

        Raises
        ------
        TaskError
            A missing value, text in a numeric column, or a category the encoding does not list.
        """
        out = np.zeros((len(rows), self.width), dtype=np.float32)
        start = 0
        for column in self.columns:
            for i, row in enumerate(rows):
                value = _text(row, column.name, i + 1, self.what)
                if column.categories is None:
                    out[i, start] = _scaled(column, value, i + 1, self.what)
                elif value in column.categories:
                    out[i, start + column.categories.index(value)] = 1.0
                else:
                    raise TaskError(
                        f"{self.what}: row {i + 1}'s {column.name} {value!r} is not one of its categories "
                        f"({', '.join(column.categories)}); list it in task.options.categorical.{column.name}"
                    )
            start += column.width
        return out


def _text(row: Mapping[str, object], name: str, number: int, what: str) -> str:
    if name not in row:
        raise TaskError(f"{what}: row {number} has no {name!r} field (it has: {', '.join(row)})")
    value = row[name]
    text = "" if value is None else str(value).strip()
    if text.lower() in MISSING:
        raise TaskError(f"{what}: row {number}'s {name} is missing; fill it in or leave the row out of the table")
    return text


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _range(name: str, bounds: Sequence[float]) -> tuple[float, float]:
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise TaskError(f"task.options.ranges.{name} must be [low, high], got {bounds!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise TaskError(f"task.options.ranges.{name} must be [low, high] with low < high, got {bounds!r}")
    return low, high


def _scaled(column: Column, text: str, number: int, what: str) -> float:
    if not _is_number(text):
        raise TaskError(f"{what}: row {number}'s {column.name} {text!r} is not a number (a numeric column)")
    if column.high <= column.low:
        return 0.0  # a constant column carries nothing
    return float(np.clip((float(text) - column.low) / (column.high - column.low), 0.0, 1.0) * 2.0 - 1.0)
