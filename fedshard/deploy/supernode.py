"""``python -m fedshard.deploy.supernode``: Flower's SuperNode, with its hard-coded waits shortened.

Flower 1.42's SuperNode loop (``flwr.supernode.start_client_internal``) sleeps a fixed
3 s whenever a pull from the SuperLink finds no message, and 0.5 s between looks for the
ClientApp's reply; a round that sends each site two messages waits up to 7 s on these
sleeps alone. Flower offers no setting for them, so this entry point gives that one
module a ``time`` whose ``sleep`` waits ``--poll-s`` instead of 3 s and at most
``--wait-s`` instead of 0.5 s, then runs ``flower-supernode`` unchanged with the remaining
arguments. Nothing else changes: the pulls, TLS, SuperNode authentication and message
handling are Flower's. :mod:`fedshard.deploy.flower_internals` checks that the loop still
sleeps this way before ``fedshard site up`` uses this entry point.

    python -m fedshard.deploy.supernode --poll-s 0.2 -- --superlink HOST:PORT ...

A shorter ``--poll-s`` costs the SuperLink one more pull per site per interval (an idle
federation of 100 sites at 0.2 s: 500 small HTTPS requests a second).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

__all__ = ["PollClock", "install", "main"]

IDLE_SLEEP_S = 3.0
"""Flower's hard-coded wait after an empty pull (anything this long or longer is that wait)."""


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


def install(poll_s: float, wait_s: float) -> PollClock:
    """Give Flower's SuperNode loop a :class:`PollClock`; returns it."""
    module = importlib.import_module("flwr.supernode.start_client_internal")
    clock = PollClock(poll_s, wait_s)
    module.time = clock  # type: ignore[attr-defined]  # read at every sleep of the loop
    return clock


def main(argv: list[str] | None = None) -> None:
    """Parse our two options, install the clock, run ``flower-supernode`` with the rest."""
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else ([], argv)
    parser = argparse.ArgumentParser(prog="python -m fedshard.deploy.supernode", description=__doc__.split("\n")[0])
    parser.add_argument("--poll-s", type=float, default=0.2, help="wait after an empty pull (Flower: 3 s)")
    parser.add_argument("--wait-s", type=float, default=0.02, help="longest other wait (Flower: 0.5 s)")
    args = parser.parse_args(ours)
    install(args.poll_s, args.wait_s)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
