"""Child processes of ``fedshard aggregator up`` / ``site up``: started in their own
session (a Ctrl-C reaches only us, and we stop them in order), logged to a file,
stopped with their whole process tree, and stopped by the kernel when we die, however
we die (``kill -9`` included: Linux's parent-death signal, SIGTERM), so that no zone,
SuperLink or SuperNode goes on headless holding its ports. A SuperLink that stops ends
the SuperExec and ServerApp it started."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fedshard.errors import DeployError

__all__ = ["Child", "descendants", "spawn", "wait_for_port"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TAIL_BYTES = 16384
"""How much of the end of a log :meth:`Child.tail` reads (a long run's log may be large)."""


@dataclass
class Child:
    """A started process, its log file and the processes it started.

    ``cmd``, ``env`` and ``cwd`` are how it was started (:meth:`restart` starts it again
    the same way); ``restarts`` counts those restarts.
    """

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    cmd: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    restarts: int = 0
    _tree: dict[int, float] = field(default_factory=dict)  # pid -> its start time (pids are reused)
    _cursor: int = 0  # where :meth:`new_lines` reads on

    def __post_init__(self) -> None:
        self._cursor = _size(self.log)

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 3) -> str:
        """The last lines of its log, on one line (for error messages; reads only the log's end)."""
        try:
            with self.log.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        text = _ANSI.sub("", text)  # Flower colours its log levels
        kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(kept)

    def new_lines(self) -> str:
        """Whole lines this process added to its log since it started or the last call."""
        try:
            with self.log.open("rb") as f:
                f.seek(self._cursor)
                chunk = f.read()
        except OSError:
            return ""
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._cursor += len(complete)
        return _ANSI.sub("", complete.decode(errors="replace"))

    def exit_reason(self) -> str:
        """Why it is gone, on one line: its exit code and the last lines of its log."""
        again = f" again after {self.restarts} restart(s)" if self.restarts else ""
        tail = self.tail() or "its log is empty"
        return f"{self.name} exited{again} ({self.exit_status()}): {tail} (log: {self.log})"

    def restart(self) -> None:
        """Start it again with the same command, environment and folder (its log continues).

        Raises
        ------
        DeployError
            It still runs, or it cannot be started.
        """
        if self.alive():
            raise DeployError(f"{self.name} is still running (pid {self.pid}); stop it before restarting it")
        if not self.cmd:
            raise DeployError(f"{self.name} cannot be restarted: how it was started is not known")
        self.stop()  # anything it left behind (Flower detaches some processes)
        with self.log.open("ab") as out:
            out.write(f"--- fedshard: restarting {self.name} ({self.exit_status()}) ---\n".encode())
        self.popen = spawn(self.name, self.cmd, self.log, self.env, self.cwd).popen
        self.restarts += 1
        self._tree = {}
        self._cursor = _size(self.log)

    def exit_status(self) -> str:
        """Its exit status in words (``code 1``, ``killed by signal 9``; ``running``)."""
        code = self.popen.returncode
        if code is None:
            return "running"
        return f"killed by signal {-code}" if code < 0 else f"code {code}"

    def remember_tree(self) -> None:
        """Note the processes it started so far (Flower detaches some into their own sessions)."""
        for pid in descendants(self.pid):
            started = _start_time(pid)
            if started is not None:
                self._tree[pid] = started
        # forget those that are gone, lest their pid be given to an unrelated process
        self._tree = {pid: t for pid, t in self._tree.items() if _start_time(pid) == t}

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM it, wait up to ``timeout``, then SIGKILL it and anything it started."""
        self.remember_tree()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        for pid, started in self._tree.items():
            if _start_time(pid) != started:
                continue  # gone, and its pid maybe someone else's now
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started (psutil); None if it is gone. With its pid, it names one
    process: a pid alone may be another's once the first is gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


_PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal this process gets when the thread that started it exits."""


def _parent_death_signal() -> Callable[[], None] | None:
    """What a child runs between fork and exec so that it gets SIGTERM when this process dies
    (None where Linux's ``prctl`` is not there). Resolved here, in the parent: the child only
    calls it. The signal follows the thread that starts the child, so children are started
    from the thread that lives as long as the command (its main thread)."""
    if os.uname().sysname != "Linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nobody would send it
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


def spawn(name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None) -> Child:
    """Start ``cmd`` in a new session, stdout and stderr appended to ``log``; it gets SIGTERM
    when this process dies (see the module docstring)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        try:
            popen = subprocess.Popen(
                list(cmd),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_parent_death_signal(),  # one prctl call between fork and exec
            )
        except OSError as exc:
            raise DeployError(f"cannot start {name} ({cmd[0]}): {exc.strerror or exc}") from None
    return Child(name, popen, log, tuple(cmd), dict(env), cwd)


def wait_for_port(child: Child, host: str, port: int, timeout: float) -> None:
    """Wait until ``host:port`` accepts connections; :class:`DeployError` if ``child`` exits or time runs out."""
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host.strip("[]")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise DeployError(child.exit_reason())
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.2)
    raise DeployError(f"{child.name} did not open {host}:{port} within {timeout:.0f}s (log: {child.log})")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, in other sessions too (psutil; empty once it is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []
