"""Flower 1.42's fixed waits, shortened where a deployed round would otherwise sit idle.

Two kinds of hard-coded wait dominate a deployed round once the ClientApp processes are
warm (measured: ``bench/deploy_overhead.py``):

* the SuperNode's loop (``flwr.supernode.start_client_internal``) sleeps 3 s whenever a
  pull finds no message and 0.5 s between looks for the ClientApp's reply:
  :class:`PollClock` replaces that module's ``time`` with one whose ``sleep`` waits less;
* every pull of a message's objects (SuperNode ← SuperLink, ClientApp ← SuperNode,
  ServerApp ← SuperLink) that arrives before the sender finished pushing them backs off
  1 s, 2 s, 4 s … (``PULL_INITIAL_BACKOFF = 1``, bound as a default argument): with a
  warm ClientApp the pull usually comes that early. :func:`shorten_object_pulls` rebinds
  the pull function a module imported to one whose backoff starts at 20 ms and stops
  growing at 0.1 s; the overall limits (``max_time``, tries per object) stay Flower's.

Both patch one module attribute each and check first that it is what Flower 1.42 has
(:func:`shorten_object_pulls` returns False and changes nothing otherwise;
:mod:`fedshard.transports.flower.compat.warm_checks` checks the SuperNode loop before ``site up``
uses it).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import time
from typing import Any

from fedshard.transports.flower.compat._release import release_problem

__all__ = [
    "GRID_PULLS",
    "IDLE_SLEEP_S",
    "PULL_BACKOFF",
    "PULL_BACKOFF_CAP",
    "PollClock",
    "shorten_grid_pulls",
    "shorten_object_pulls",
]

IDLE_SLEEP_S = 3.0
"""Flower's hard-coded wait after an empty pull (anything this long or longer is that wait)."""

PULL_BACKOFF = 0.02
"""First wait before pulling an object again that was not there yet (Flower: 1 s)."""

PULL_BACKOFF_CAP = 0.1
"""Longest wait between two pulls of an object (Flower: 10 s)."""

_PULL_FUNCTIONS = ("pull_objects", "pull_and_inflate_object_from_tree")


class PollClock:
    """The ``time`` module, with ``sleep`` mapping Flower's fixed waits to shorter ones.

    Parameters
    ----------
    poll_s:
        Replaces the 3 s wait after an empty pull.
    wait_s:
        Caps every shorter wait (Flower's 0.5 s looks for a reply, which is local).
    """

    def __init__(self, poll_s: float, wait_s: float) -> None:
        self.poll_s = poll_s
        self.wait_s = wait_s

    def sleep(self, seconds: float) -> None:
        """Sleep ``poll_s`` for Flower's idle wait, at most ``wait_s`` for any other."""
        time.sleep(self.poll_s if seconds >= IDLE_SLEEP_S else min(seconds, self.wait_s))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


GRID_PULLS = "flwr.superlink.grid.http_grid"
"""Where the ServerApp's Grid pulls the objects of the sites' replies."""


def shorten_grid_pulls() -> bool:
    """:func:`shorten_object_pulls` for the ServerApp's Grid: replies are pulled as soon as they are there."""
    return shorten_object_pulls(GRID_PULLS)


def shorten_object_pulls(module_name: str) -> bool:
    """Rebind the object-pull function ``module_name`` imported to one with a short backoff.

    Returns whether it did: False (nothing changed) when the installed Flower is not the
    supported release (:mod:`fedshard.transports.flower.compat._release`), the module lacks the
    function or the function has no ``initial_backoff``/``backoff_cap`` parameters.
    """
    if release_problem("the short object pulls") is not None:
        return False
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return False
    done = False
    for name in _PULL_FUNCTIONS:
        pull = getattr(module, name, None)
        if pull is None or getattr(pull, "_fedshard_short_backoff", False):
            done = done or pull is not None
            continue
        parameters = inspect.signature(pull).parameters
        if "initial_backoff" not in parameters or "backoff_cap" not in parameters:
            continue
        short = functools.partial(pull, initial_backoff=PULL_BACKOFF, backoff_cap=PULL_BACKOFF_CAP)
        short._fedshard_short_backoff = True  # type: ignore[attr-defined]
        setattr(module, name, short)
        done = True
    return done
