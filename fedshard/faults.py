"""Fault injection: kill, stop or pause a fedshard process at a named point.

Tests (and operators rehearsing a failure) name points in the environment variable
``FEDSHARD_FAULTS`` of the process to hurt, comma-separated, each
``POINT[@N]:ACTION``::

    FEDSHARD_FAULTS="site.push.frame@3:kill"          # SIGKILL at the 3rd frame pushed
    FEDSHARD_FAULTS="zone.close:pause=5,site.commit:raise"

* ``POINT`` is a name passed to :func:`point` in the code (``site.``, ``zone.``,
  ``coordinator.`` …; ``FEDSHARD_FAULTS_LOG`` lists the ones a run reaches);
* ``@N``: act the N-th time the point is reached in this process (default: the first);
* ``ACTION``: ``kill`` (SIGKILL this process: no ``finally``, no flush, as a power cut
  or the OOM killer would), ``exit`` (``os._exit(70)``), ``raise`` (raise
  :class:`InjectedFault` there, a bug), ``pause=SECONDS`` (sleep there, a stalled
  process or a slow disk).

``FEDSHARD_FAULTS_LOG=FILE`` appends ``POINT N`` to ``FILE`` each time a point is
reached (flushed at once, so it survives a kill): a test learns from one clean run which
points a message passes, then kills a fresh run at each. Neither variable set: a point
costs one dictionary lookup. :func:`configure` does the same for the current process
(in-process tests); a malformed variable raises :class:`~fedshard.errors.ConfigError`
at the first point reached.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass

from fedshard.errors import ConfigError

__all__ = ["ENV", "LOG_ENV", "Fault", "InjectedFault", "configure", "parse", "point"]

ENV = "FEDSHARD_FAULTS"
LOG_ENV = "FEDSHARD_FAULTS_LOG"
_ACTIONS = ("kill", "exit", "raise", "pause")


class InjectedFault(RuntimeError):  # noqa: N818 (a fault, not an error of fedshard's)
    """Raised at a point whose action is ``raise`` (never by fedshard's own logic)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: act the ``nth`` time ``point`` is reached."""

    point: str
    nth: int
    action: str
    seconds: float = 0.0


def parse(spec: str) -> dict[str, list[Fault]]:
    """Faults by point, from ``FEDSHARD_FAULTS`` syntax.

    Raises
    ------
    ConfigError
        On a malformed entry (names the entry and the syntax).
    """
    faults: dict[str, list[Fault]] = {}
    for raw in filter(None, (part.strip() for part in spec.split(","))):
        where, sep, action = raw.rpartition(":")
        name, _, nth = where.partition("@")
        verb, _, arg = action.partition("=")
        try:
            if not sep or not name or verb not in _ACTIONS or (verb == "pause") != bool(arg):
                raise ValueError
            fault = Fault(name, int(nth) if nth else 1, verb, float(arg) if arg else 0.0)
            if fault.nth < 1 or fault.seconds < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"{ENV}: bad entry {raw!r}; write POINT[@N]:ACTION with ACTION one of kill, exit, raise, pause=SECONDS"
            ) from None
        faults.setdefault(name, []).append(fault)
    return faults


class _State:
    def __init__(self, spec: str, log: str | None) -> None:
        self.faults = parse(spec)
        self.log = log
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()


_UNSET = _State("", None)
_state: _State | None = _UNSET  # read from the environment at the first point reached


def configure(spec: str | None = None, log: str | None = None) -> None:
    """Plan faults for this process (``None``: from the environment; ``""``: none)."""
    global _state
    spec = os.environ.get(ENV, "") if spec is None else spec
    log = os.environ.get(LOG_ENV) if log is None else log
    _state = _State(spec, log or None) if spec or log else None


def point(name: str) -> None:
    """A named point where a planned fault may strike (see the module docstring)."""
    if _state is _UNSET:
        configure()
    state = _state
    if state is None:
        return
    with state.lock:
        state.counts[name] += 1
        n = state.counts[name]
        if state.log is not None:
            with open(state.log, "a", encoding="utf-8") as f:
                f.write(f"{name} {n}\n")
    for fault in state.faults.get(name, ()):
        if fault.nth == n:
            _act(fault)


def _act(fault: Fault) -> None:
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # the signal is delivered asynchronously; never run past the point
    elif fault.action == "exit":
        os._exit(70)
    elif fault.action == "raise":
        raise InjectedFault(f"fault injected at {fault.point} (occurrence {fault.nth})")
    else:
        time.sleep(fault.seconds)
