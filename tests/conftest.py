"""Shared test fixtures; the suite's time budget (:mod:`tests.time_budget`) and which tests
never run side by side under ``pytest -n`` (:data:`tests.time_budget.GROUPS`)."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

from tests.process_clock import ProcessTreeClock
from tests.time_budget import BUDGET_S, GROUPS, SLOW_ALLOWED, SPREAD, WALL_CAP_S
from tests.toy_parts import PerTensorGaussian, PerTensorNoise

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
# Wide output for every CLI the tests run (rich fixes a console's width when it is made): a path
# under pytest-xdist's longer tmp folders would otherwise wrap mid-line.
os.environ.setdefault("COLUMNS", "400")
# One OpenMP thread per process (torch's intra-op pool), in the workers and every process they start:
# pytest-xdist's workers already fill the cores, and an OpenMP thread that spin-waits for a core
# another process holds only burns it (measured: the demo's tests took 20 % less CPU and less time
# with one thread, even alone on the machine). A test or benchmark that needs more sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _group(node_id: str) -> str | None:
    """The ``xdist_group`` of a test: :data:`GROUPS`' by node id prefix, none for a module in
    :data:`SPREAD`, else its module (whose module-scoped fixtures are then set up once)."""
    for prefix, group in GROUPS.items():
        if node_id.startswith(prefix):
            return group
    module = node_id.split("::", 1)[0]
    return None if module in SPREAD else module


def pytest_itemcollected(item: pytest.Item) -> None:
    """Put each test into its ``xdist_group`` (:func:`_group`), as it is collected: before
    pytest-xdist's ``pytest_collection_modifyitems`` reads the groups."""
    group = _group(item.nodeid)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


def _node_id(item: pytest.Item) -> str:
    """``item``'s node id without the ``@group`` pytest-xdist appends under ``--dist loadgroup``."""
    groups = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
    suffix = "@" + "_".join(groups)
    return item.nodeid.removesuffix(suffix) if groups else item.nodeid


def _allowed(item: pytest.Item, when: str) -> bool:
    """Whether ``item``'s ``when`` phase may take over the budget (listed in :data:`SLOW_ALLOWED`)."""
    if _node_id(item) in SLOW_ALLOWED:
        return True
    return when == "setup" and any(f"fixture:{name}" in SLOW_ALLOWED for name in getattr(item, "fixturenames", ()))


_CPU_S = pytest.StashKey[dict[str, float]]()
"""On a test item: its phase → the CPU seconds its process tree spent in it."""


def _timed(item: pytest.Item, when: str) -> Generator[None, Any, None]:
    """Run one phase of ``item``, noting on it the CPU seconds its process tree spent."""
    clock = ProcessTreeClock()
    clock.start()
    try:
        yield
    finally:
        item.stash.setdefault(_CPU_S, {})[when] = clock.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, None]:
    """Time a test's setup in CPU seconds (:func:`_timed`)."""
    yield from _timed(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    """Time a test's body in CPU seconds (:func:`_timed`)."""
    yield from _timed(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    """Fail a test whose setup or body spent over :data:`BUDGET_S` seconds of a core, or lasted
    over :data:`WALL_CAP_S`, unless it is listed."""
    outcome = yield
    report = outcome.get_result()
    if report.when not in ("setup", "call"):
        return
    cpu = item.stash.get(_CPU_S, {}).get(report.when, 0.0)
    report.user_properties.append(("cpu_s", cpu))
    if not BUDGET_S or not report.passed or _allowed(item, report.when):
        return
    if cpu > BUDGET_S or report.duration > WALL_CAP_S:
        report.outcome = "failed"
        report.longrepr = (
            f"{_node_id(item)}: its {report.when} spent {cpu:.1f} s of CPU in {report.duration:.1f} s, over the "
            f"suite's budget of {BUDGET_S:g} s of CPU and {WALL_CAP_S:g} s; make it faster, or list it in "
            "tests/time_budget.py with the reason it cannot be"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the phases that spent the most CPU time (beside pytest's slowest wall times)."""
    spent = [
        (value, f"{report.when:<8} {report.nodeid}")
        for reports in terminalreporter.stats.values()
        for report in reports
        if isinstance(report, pytest.TestReport)
        for name, value in report.user_properties
        if name == "cpu_s" and value >= 1.0
    ]
    if not spent:
        return
    terminalreporter.write_sep(
        "=", "most CPU time (the budget's measure: seconds of a core, processes started included)"
    )
    for value, what in sorted(spent, reverse=True)[:25]:
        terminalreporter.write_line(f"{value:7.1f}s {what}")


@pytest.fixture
def per_tensor() -> Generator[PerTensorGaussian, None, None]:
    """:class:`~tests.toy_parts.PerTensorGaussian` registered for one test (its releases counted afresh)."""
    from fedshard.privacy.mechanisms import MECHANISMS, register

    toy = PerTensorGaussian()
    register(toy)
    PerTensorNoise.released.clear()
    yield toy
    MECHANISMS.remove(toy.name)
