"""The tabular task (fedshard.tasks.tabular): a user's table of records, encoded, split and trained on,
and every bad table refused in one line."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshard.errors import TaskError
from fedshard.task import Partition, TrainSettings
from fedshard.tasks.tabular.columns import Encoding
from fedshard.tasks.tabular.task import Classification


def _table(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _cohort(tmp_path: Path, n: int = 200) -> Path:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        age = int(rng.integers(20, 90))
        stage = ["I", "II", "III"][int(rng.integers(0, 3))]
        died = int(age > 60 or stage == "III")
        rows.append({"patient_id": f"p{i}", "age": age, "stage": stage, "follow_up": i, "died": died})
    return _table(tmp_path / "cohort.csv", rows)


def test_numbers_are_scaled_by_their_range_and_categories_are_one_hot() -> None:
    rows = [{"age": "30", "stage": "I"}, {"age": "90", "stage": "III"}, {"age": "150", "stage": "II"}]
    encoding = Encoding.of(rows, ["age", "stage"], ranges={"age": [0, 120]})
    assert encoding.width == 4 and [c.categories for c in encoding.columns] == [None, ("I", "II", "III")]
    x = encoding.encode(rows)
    assert x[:, 0].tolist() == pytest.approx([-0.5, 0.5, 1.0])  # 150 clipped to the range's top
    assert x[:, 1:].tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    declared = Encoding.of(rows, ["stage"], categorical={"stage": ["I", "II"]})
    with pytest.raises(TaskError, match=r"row 2's stage 'III' is not one of its categories \(I, II\)"):
        declared.encode(rows)


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        ([{"age": ""}], {}, "row 1's age is missing"),
        ([{"age": "3"}, {"age": "NA"}], {}, "row 2's age is missing"),
        ([{"age": "3"}], {"ranges": {"age": [5, 5]}}, r"ranges.age must be \[low, high\] with low < high"),
        ([{"stage": "I"}], {"ranges": {"stage": [0, 1]}}, "stage is categorical"),
    ],
)
def test_a_bad_column_is_one_line(rows: list[dict[str, object]], options: dict, message: str) -> None:
    with pytest.raises(TaskError, match=message) as info:
        Encoding.of(rows, list(rows[0]), **options).encode(rows)
    assert "\n" not in str(info.value)


def test_a_table_becomes_label_skewed_site_shares_of_its_training_part_and_trains(tmp_path: Path) -> None:
    task = Classification(
        data=str(_cohort(tmp_path)), label_column="died", labels=["0", "1"], exclude=["patient_id", "follow_up"]
    )
    assert [c.name for c in task.encoding.columns] == ["age", "stage"] and task.encoding.width == 4
    pooled = task.load_data(Partition(None, 4, 7))
    assert pooled.num_train + pooled.num_test == 200 and pooled.num_test == 40  # fold 0 of 5
    shares = [task.load_data(Partition(i, 4, 7)) for i in range(4)]
    assert sum(s.num_train for s in shares) == pooled.num_train
    assert sum(s.num_test for s in shares) == pooled.num_test
    torch.manual_seed(0)
    model = task.build_model()
    before = task.evaluate(model, pooled)
    task.train(model, pooled, TrainSettings(40, 32, 0.5, 0))
    after = task.evaluate(model, pooled)
    assert after.accuracy is not None and after.accuracy >= 0.85 and after.loss < before.loss
    validation = Classification(
        data=str(_cohort(tmp_path)), label_column="died", labels=["0", "1"], validation_fraction=0.25
    )
    assert validation.load_data(Partition(None, 4, 7)).num_test == 40  # a quarter of the 160 training records


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"labels": ["0", "2"]}, r"row \d+'s died '1' is not one of task.options.labels \(0, 2\)"),
        ({"exclude": ["nope"]}, "no column 'nope'"),
        ({"features": ["died"]}, "'died' is the label; the model must not see it"),
        ({"labels": ["0"]}, "at least two distinct classes"),
        ({"fold": 5}, "0 <= fold < folds"),
    ],
)
def test_a_bad_task_is_one_line(tmp_path: Path, options: dict, message: str) -> None:
    settings = {"data": str(_cohort(tmp_path)), "label_column": "died", "labels": ["0", "1"], **options}
    with pytest.raises(TaskError, match=message) as info:
        Classification(**settings)
    assert "\n" not in str(info.value)
