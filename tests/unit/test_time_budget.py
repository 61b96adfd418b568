"""The suite's time budget (tests/conftest.py, tests/time_budget.py): a test over it fails
unless listed with its reason; every test lands in its pytest-xdist group."""

from __future__ import annotations

import pytest

import tests.conftest as suite
from tests.time_budget import GROUPS, RAY, SLOW_ALLOWED, SPREAD

pytest_plugins = ["pytester"]

INNER = """
import subprocess
import sys
import time

SPIN = "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass"

def test_fast():
    pass

def test_waits_a_little():
    time.sleep(0.3)

def test_waits_too_long():
    time.sleep(1.2)

def test_computes():
    exec(SPIN)

def test_computes_in_a_child():
    subprocess.run([sys.executable, "-c", SPIN], check=True)

def test_computes_but_listed():
    exec(SPIN)
"""


def test_a_test_over_the_budget_fails_unless_it_is_listed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget counts the CPU time of the test's processes, children included; waiting counts
    only against the wall-time cap."""
    pytester.makeconftest(
        "from tests.conftest import pytest_runtest_call, pytest_runtest_makereport, pytest_runtest_setup  # noqa\n"
    )
    path = pytester.makepyfile(test_inner=INNER)
    monkeypatch.setattr(suite, "BUDGET_S", 0.3)
    monkeypatch.setattr(suite, "WALL_CAP_S", 1.0)
    monkeypatch.setitem(SLOW_ALLOWED, f"{path.name}::test_computes_but_listed", "a reason")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    monkeypatch.undo()  # this test is held to the real budget
    result.assert_outcomes(passed=3, failed=3)
    over = "over the suite's budget of 0.3 s of CPU and 1 s*"
    result.stdout.fnmatch_lines_random(
        [
            f"*test_inner.py::test_computes: its call spent 0.* s of CPU in * s, {over}",
            f"*test_inner.py::test_computes_in_a_child: its call spent 0.* s of CPU in * s, {over}",
            f"*test_inner.py::test_waits_too_long: its call spent 0.0 s of CPU in 1.* s, {over}",
        ]
    )


def test_every_test_has_its_group() -> None:
    assert suite._group("tests/integration/test_ray_cluster.py::test_x") == RAY
    assert suite._group("tests/unit/protocol/test_codes.py::test_y[a]") == "tests/unit/protocol/test_codes.py"
    assert all(suite._group(f"{module}::test_z") is None for module in SPREAD)
    assert all(prefix.startswith("tests/") for prefix in GROUPS)
