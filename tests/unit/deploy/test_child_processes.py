"""``fedshard.deploy._processes.Child``: real child processes, their logs, restarts and what
they leave behind."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fedshard.deploy._processes import Child, spawn
from fedshard.errors import DeployError

PY = sys.executable


def _wait_gone(child: Child) -> None:
    child.popen.wait(30)


def test_a_child_that_dies_says_how_and_its_last_lines_on_one_line(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("an older run's line\n")
    child = spawn(
        "worker", [PY, "-c", "print('\\x1b[91mERROR\\x1b[0m: boom'); print('bye'); raise SystemExit(3)"], log, {}
    )
    _wait_gone(child)
    assert child.exit_status() == "code 3"
    assert child.exit_reason() == f"worker exited (code 3): an older run's line | ERROR: boom | bye (log: {log})"
    assert child.new_lines() == "ERROR: boom\nbye\n"  # this process's lines only, uncoloured
    assert child.new_lines() == ""  # read once


def test_restart_runs_the_same_command_once_more_and_counts_it(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    child = spawn("worker", [PY, "-c", "import time; print('up', flush=True); time.sleep(60)"], log, dict(os.environ))
    with pytest.raises(DeployError, match="still running"):
        child.restart()
    first = child.pid
    os.kill(first, signal.SIGKILL)
    _wait_gone(child)
    assert child.exit_status() == "killed by signal 9"
    child.restart()
    try:
        assert child.alive() and child.pid != first and child.restarts == 1
        deadline = time.monotonic() + 30
        while "up" not in child.new_lines() and time.monotonic() < deadline:  # only the new process's lines
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
        _wait_gone(child)
        assert child.exit_reason().startswith("worker exited again after 1 restart(s) (killed by signal 9): ")
        assert "restarting worker (killed by signal 9)" in log.read_text()
    finally:
        child.stop()


def test_a_child_started_without_its_command_cannot_be_restarted(tmp_path: Path) -> None:
    child = spawn("worker", [PY, "-c", "pass"], tmp_path / "x.log", {})
    _wait_gone(child)
    bare = Child(child.name, child.popen, child.log)
    with pytest.raises(DeployError, match="cannot be restarted"):
        bare.restart()


def test_what_a_child_started_is_stopped_even_after_the_child_was_killed(tmp_path: Path) -> None:
    # the child starts a grandchild in its own session (as Flower's SuperLink does its ServerApp)
    script = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        "time.sleep(120)"
    )
    child = spawn("parent", [PY, "-c", script], tmp_path / "x.log", dict(os.environ))
    try:
        deadline = time.monotonic() + 30
        while not child._tree and time.monotonic() < deadline:
            child.remember_tree()
            time.sleep(0.1)
        (grandchild,) = child._tree
        os.kill(child.pid, signal.SIGKILL)  # the grandchild is orphaned
        _wait_gone(child)
    finally:
        child.stop()
    deadline = time.monotonic() + 30
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"
