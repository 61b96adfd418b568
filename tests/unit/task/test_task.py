"""Loading task plug-ins by "module:object"."""

from __future__ import annotations

import pytest

from fedshard.errors import TaskError
from fedshard.task import Partition, Task, load_task


def test_factory_is_called_with_options() -> None:
    task = load_task("tests.toy_task:task", {"examples": 12})
    assert isinstance(task, Task)
    data = task.load_data(Partition(0, 2, seed=1))
    assert data.num_train + data.num_test == 12


def test_breast_cancer_task_partitions_are_disjoint_and_non_iid() -> None:
    task = load_task("clients.tasks.breast_cancer:task")
    parts = [task.load_data(Partition(i, 4, seed=7)) for i in range(4)]
    whole = task.load_data(Partition(None, 4, seed=7))
    assert sum(p.num_train for p in parts) == whole.num_train
    assert sum(p.num_test for p in parts) == whole.num_test
    malignant_share = [float((p.train.y == 0).float().mean()) for p in parts]
    # sorted by mean radius: the last partition holds far more malignant cases than the first
    assert malignant_share[-1] - malignant_share[0] > 0.5


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:task", "cannot import task module"),
        ("tests.toy_task:missing", "has no attribute 'missing'"),
        ("tests.toy_task:not_a_task", "does not implement the Task protocol"),
        ("tests.toy_task:np", "neither a Task nor a factory"),
    ],
)
def test_bad_targets(target: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        load_task(target)


def test_bad_options() -> None:
    with pytest.raises(TaskError, match="cannot build task"):
        load_task("tests.toy_task:task", {"nope": 1})
