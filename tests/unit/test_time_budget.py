"""The suite's time budget (tests/conftest.py, tests/time_budget.py): a test over it fails
unless listed with its reason; every test lands in its pytest-xdist group."""

from __future__ import annotations

import pytest

import tests.conftest as suite
from tests.time_budget import GROUPS, RAY, SLOW_ALLOWED, SPREAD

pytest_plugins = ["pytester"]

INNER = """
import time

def test_fast():
    pass

def test_slow():
    time.sleep(0.4)

def test_slow_but_listed():
    time.sleep(0.4)
"""


def test_a_test_over_the_budget_fails_unless_it_is_listed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    path = pytester.makepyfile(test_inner=INNER)
    monkeypatch.setattr(suite, "BUDGET_S", 0.2)
    monkeypatch.setitem(SLOW_ALLOWED, f"{path.name}::test_slow_but_listed", "a reason")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    monkeypatch.undo()  # this test is held to the real budget
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_inner.py::test_slow: its call took * s, over the suite's 0.2 s budget*"])


def test_every_test_has_its_group() -> None:
    assert suite._group("tests/integration/test_ray_cluster.py::test_x") == RAY
    assert suite._group("tests/unit/protocol/test_codes.py::test_y[a]") == "tests/unit/protocol/test_codes.py"
    assert all(suite._group(f"{module}::test_z") is None for module in SPREAD)
    assert all(prefix.startswith("tests/") for prefix in GROUPS)
