"""``python -m fedshard.transports.flower.compat.supernode``: Flower's SuperNode, with its hard-coded waits shortened.

Flower 1.42's SuperNode loop (``flwr.supernode.start_client_internal``) sleeps a fixed
3 s whenever a pull from the SuperLink finds no message, 0.5 s between looks for the
ClientApp's reply, and backs off 1 s, 2 s, … when a message's objects are not on the
SuperLink yet; a round that sends each site two messages waits seconds on these alone.
Flower offers no setting for them, so this entry point gives that one module a ``time``
whose ``sleep`` waits ``--poll-s`` instead of 3 s and at most ``--wait-s`` instead of
0.5 s, and an object pull with a short backoff
(:mod:`fedshard.transports.flower.compat.waits`), then runs ``flower-supernode`` unchanged with
the remaining arguments. Nothing else changes: the pulls, TLS, SuperNode authentication
and message handling are Flower's. :mod:`fedshard.transports.flower.compat.warm_checks` checks that
the loop still sleeps this way before ``fedshard site up`` uses this entry point.

    python -m fedshard.transports.flower.compat.supernode --poll-s 0.2 -- --superlink HOST:PORT ...

A shorter ``--poll-s`` costs the SuperLink one more pull per site per interval (an idle
federation of 100 sites at 0.2 s: 500 small HTTPS requests a second).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fedshard.transports.flower.compat.waits import PollClock, shorten_object_pulls

__all__ = ["LOOP", "install", "main"]

LOOP = "flwr.supernode.start_client_internal"
"""The module of Flower's SuperNode loop."""


def install(poll_s: float, wait_s: float) -> PollClock:
    """Give Flower's SuperNode loop a :class:`PollClock` and short object-pull backoffs; returns the clock."""
    module = importlib.import_module(LOOP)
    clock = PollClock(poll_s, wait_s)
    module.time = clock  # type: ignore[attr-defined]  # read at every sleep of the loop
    shorten_object_pulls(LOOP)
    return clock


def main(argv: list[str] | None = None) -> None:
    """Parse our two options, install the waits, run ``flower-supernode`` with the rest."""
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else ([], argv)
    parser = argparse.ArgumentParser(
        prog="python -m fedshard.transports.flower.compat.supernode", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--poll-s", type=float, default=0.2, help="wait after an empty pull (Flower: 3 s)")
    parser.add_argument("--wait-s", type=float, default=0.02, help="longest other wait (Flower: 0.5 s)")
    args = parser.parse_args(ours)
    install(args.poll_s, args.wait_s)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
