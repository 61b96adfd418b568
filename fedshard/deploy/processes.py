"""Child processes of ``fedshard aggregator up`` / ``site up``: started in their own
session (a Ctrl-C reaches only us, and we stop them in order), logged to a file,
stopped with their whole process tree."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedshard.errors import DeployError

__all__ = ["Child", "descendants", "spawn", "wait_for_port"]


@dataclass
class Child:
    """A started process, its log file and the processes it started."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _tree: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 3) -> str:
        """The last lines of its log, on one line (for error messages)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(kept)

    def remember_tree(self) -> None:
        """Note the processes it started so far (Flower detaches some into their own sessions)."""
        self._tree |= set(descendants(self.pid))

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
        for pid in self._tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def spawn(name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None) -> Child:
    """Start ``cmd`` in a new session, stdout and stderr appended to ``log``."""
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
            )
        except OSError as exc:
            raise DeployError(f"cannot start {name} ({cmd[0]}): {exc.strerror or exc}") from None
    return Child(name, popen, log)


def wait_for_port(child: Child, host: str, port: int, timeout: float) -> None:
    """Wait until ``host:port`` accepts connections; :class:`DeployError` if ``child`` exits or time runs out."""
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host.strip("[]")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise DeployError(f"{child.name} exited (code {child.popen.returncode}): {child.tail()} (log: {child.log})")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.2)
    raise DeployError(f"{child.name} did not open {host}:{port} within {timeout:.0f}s (log: {child.log})")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
