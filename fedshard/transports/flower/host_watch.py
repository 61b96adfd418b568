"""A deployed ServerApp ends when the aggregator host that started the deployment dies.

``fedshard aggregator up`` starts the SuperLink, which starts Flower's SuperExec, which
starts the ServerApp: the ServerApp is not the host's child, so the kernel's parent-death
signal (:mod:`fedshard.deploy._processes`) does not reach it. The host therefore names
itself in :data:`HOST_PID_ENV`, which Flower's processes pass on, and the ServerApp watches
that process. When the host is gone (``kill -9`` included), the ServerApp exits, so no
coordinator goes on headless. A coordinator stuck in a long call would otherwise notice
only when that call ends. The run folder keeps what the run got to, and
``aggregator up --resume`` goes on from there.
"""

from __future__ import annotations

import logging
import os
import threading

__all__ = ["HOST_PID_ENV", "pid_alive", "stop_with_host"]

log = logging.getLogger(__name__)

HOST_PID_ENV = "FEDSHARD_HOST_PID"
"""The aggregator host's process id, in the environment of every process it starts."""

_EVERY_S = 1.0


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists (one of another user's counts); False for None."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_with_host() -> None:
    """Watch the host named in :data:`HOST_PID_ENV` from a daemon thread; exit this process
    (status 70) once it is gone. Does nothing outside a deployment (the variable unset)."""
    raw = os.environ.get(HOST_PID_ENV, "")
    if not raw.isdigit():
        return
    pid = int(raw)

    def watch() -> None:
        while pid_alive(pid):
            threading.Event().wait(_EVERY_S)
        log.warning("the aggregator host (pid %d) is gone; the ServerApp stops with it", pid)
        os._exit(70)

    threading.Thread(target=watch, name="fedshard-host-watch", daemon=True).start()
