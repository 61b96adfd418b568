"""The CPU time a test costs: the seconds of a core its process and every process it starts
spend, whatever else shares the machine (:mod:`tests.time_budget` holds a test to it).

A test's wall time on a shared machine measures the machine as much as the test: three
pytest-xdist workers on two cores, a deployment's dozen processes beside them, or a slow day
on a shared host stretch it two- to three-fold. The CPU time its processes spend does not
stretch that way, so the budget is kept in it.

What is counted: the worker's own time, the time of the children it has reaped (which holds
theirs, recursively), and for every descendant alive at either end of the phase, its own and
its reaped children's time, as a difference when it was alive at both (one that ended within
the phase is in its parent's reaped time, less what it had spent before). A descendant that
ends without being waited for by a process of the tree (a child of a site killed with its
group goes to init) is not counted: the wall-time cap still holds such a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

__all__ = ["ProcessTreeClock"]

_Key = tuple[int, float]
"""A process: its pid and start time (a pid may be reused within a test)."""


def _spent(times: psutil._common.pcputimes) -> float:
    """A process's user and system seconds, its waited-for children's included."""
    return float(times.user + times.system + times.children_user + times.children_system)


def _tree(root: psutil.Process) -> dict[_Key, float]:
    """Each living process of ``root``'s tree (``root`` included) → the CPU seconds it has spent."""
    out: dict[_Key, float] = {}
    try:
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        members = [root]
    for proc in members:
        try:
            with proc.oneshot():
                out[(proc.pid, proc.create_time())] = _spent(proc.cpu_times())
        except psutil.Error:  # it ended between the listing and the reading
            continue
    return out


@dataclass
class ProcessTreeClock:
    """Reads the CPU seconds spent by this process's tree between :meth:`start` and :meth:`stop`."""

    root: psutil.Process = field(default_factory=psutil.Process)
    _before: dict[_Key, float] = field(default_factory=dict)

    def start(self) -> None:
        """Note the time every living process of the tree has spent so far."""
        self._before = _tree(self.root)

    def stop(self) -> float:
        """The CPU seconds the tree spent since :meth:`start`."""
        after = _tree(self.root)
        spent = sum(now - self._before.get(key, 0.0) for key, now in after.items())
        # a process alive at the start that has ended since: its parent, having waited for it,
        # holds all it spent, before the start too, which is taken off again
        spent -= sum(then for key, then in self._before.items() if key not in after)
        return max(0.0, spent)
