"""The public medical tables of ``bench/dp_tables.py`` (not a benchmark itself), written as the CSV
files a user would bring, each with a binary clinical outcome.

A fixed list, so results compare from run to run; every table ships inside a PyPI wheel (the
bench's dependencies, not the product's): scikit-survival's ``gbsg2``, ``whas500``, ``aids`` and
``veterans_lung_cancer``, lifelines' ``kidney_transplant``, scikit-learn's breast cancer. The
survival tables' outcome is whether the event (death, recurrence, AIDS) was observed during
follow-up; their follow-up time is left out of the table (it would give the outcome away).
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SMOKE_TABLE", "TABLES", "Table", "add_fold_args", "chosen_tables", "write_table"]

OUTCOME = "outcome"
"""The outcome column of every written table (``0`` or ``1``)."""


@dataclass(frozen=True)
class Table:
    """One public table: its name, where it comes from and what its outcome is."""

    name: str
    source: str
    outcome: str
    load: Callable[[], tuple[Any, Any]]
    """``() → (features DataFrame, outcome 0/1 array)``."""


def _sksurv(loader: str) -> Callable[[], tuple[Any, Any]]:
    def load() -> tuple[Any, Any]:
        import warnings

        from sksurv import datasets

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x, y = getattr(datasets, loader)()
        return x, y[y.dtype.names[0]].astype(int)  # (event observed, time): the event

    return load


def _kidney() -> tuple[Any, Any]:
    from lifelines.datasets import load_kidney_transplant

    frame = load_kidney_transplant()
    return frame.drop(columns=["time", "death"]), frame["death"].to_numpy().astype(int)


def _breast_cancer() -> tuple[Any, Any]:
    import pandas as pd
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    return pd.DataFrame(data.data, columns=list(data.feature_names)), (data.target == 0).astype(int)  # malignant


TABLES = (
    Table(
        "gbsg2", "scikit-survival", "recurrence or death observed (German Breast Cancer Study)", _sksurv("load_gbsg2")
    ),
    Table("whas500", "scikit-survival", "death observed after a heart attack (Worcester)", _sksurv("load_whas500")),
    Table("aids", "scikit-survival", "AIDS or death observed (ACTG 320)", _sksurv("load_aids")),
    Table(
        "veterans_lung_cancer",
        "scikit-survival",
        "death observed (Veterans' lung cancer trial)",
        _sksurv("load_veterans_lung_cancer"),
    ),
    Table("kidney_transplant", "lifelines", "death observed after a kidney transplant", _kidney),
    Table("breast_cancer", "scikit-learn", "malignant (Wisconsin diagnostic)", _breast_cancer),
)
"""The fixed list of tables."""


def write_table(table: Table, folder: Path) -> tuple[Path, int]:
    """Write ``table`` as ``folder/NAME.csv`` (its features as they are, categories as text, and
    ``outcome``); returns (the path, its rows)."""
    x, y = table.load()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{table.name}.csv"
    columns = [str(c) for c in x.columns]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*columns, OUTCOME])
        for values, outcome in zip(x.itertuples(index=False), y, strict=True):
            writer.writerow([*(_cell(v) for v in values), int(outcome)])
    return path, len(y)


def _cell(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


SMOKE_TABLE = "veterans_lung_cancer"
"""The smallest table (137 records): what a bench's ``--smoke`` runs on."""


def add_fold_args(parser: argparse.ArgumentParser) -> None:
    """``--tables``, ``--repeats`` and ``--folds``: which tables, and how many test folds of each."""
    names = ",".join(t.name for t in TABLES)
    parser.add_argument("--tables", default=None, help=f"a subset of {names} (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="shuffles of the fold split (default 4; --quick 1)")
    parser.add_argument("--folds", type=int, default=5, help="folds per shuffle (default 5)")


def chosen_tables(parser: argparse.ArgumentParser, asked: str | None, smoke: bool) -> list[str]:
    """The tables ``--tables`` names (all of them by default, the smallest for ``--smoke``); an
    unknown name ends the command with one line naming the tables."""
    names = [t.name for t in TABLES]
    tables = (asked or (SMOKE_TABLE if smoke else ",".join(names))).split(",")
    unknown = [t for t in tables if t not in names]
    if unknown:
        parser.error(f"--tables: no table {unknown[0]!r}; the tables are {', '.join(names)}")
    return tables
