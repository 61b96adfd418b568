"""SIGINT and SIGTERM for the long-running commands (``zone up``, ``aggregator up``, ``site up``).

Two traps of Python's signals that a server with threads meets, and how they are avoided:

* The kernel may deliver a process-directed signal to any thread (gRPC's, say). Python then
  runs its handler only when the main thread next returns to the interpreter, and a main
  thread blocked without a timeout (``Event.wait()``) never does: the signal is lost and
  the process never stops. Whoever waits for a stop here waits in slices
  (:meth:`StopSignal.wait`).
* A handler runs in the main thread, between any two bytecodes, including while the main
  thread holds the lock inside ``Event.wait``: a handler that calls ``Event.set`` then waits
  for a lock its own thread holds, for ever. The handlers here only start a thread that
  does the work.

Handlers are installed before a server says it listens, so a signal that comes at once is
not lost either.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

__all__ = ["StopSignal", "on_signals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_SLICE_S = 0.25


def on_signals(handler: Callable[[], object]) -> None:
    """Call ``handler`` on its own thread when SIGINT or SIGTERM arrives (see the module's note)."""

    def _deferred(*_: object) -> None:
        threading.Thread(target=handler, name="fedshard-signal", daemon=True).start()

    for sig in _SIGNALS:
        signal.signal(sig, _deferred)


class StopSignal:
    """SIGINT or SIGTERM received: installed on creation, waited for in slices."""

    def __init__(self) -> None:
        self._event = threading.Event()
        on_signals(self._event.set)

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is asked for (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._event.is_set():
            left = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                return False
            self._event.wait(left)  # returns to the interpreter each slice: a pending handler runs
        return True
