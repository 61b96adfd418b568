"""Retrying a zone call that got no answer: exponential backoff with jitter, within the round.

A zone that is restarting, briefly unreachable, or that lost the connection mid-call
gives no answer (:class:`~fedshard.errors.ZoneUnavailableError`); a site tries such a
push or fetch again, waiting ``first · factor^k`` seconds (at most ``cap``) scaled by a
random factor in ``[1 − jitter, 1]`` between attempts, as long as the next attempt can
start before its deadline (the round's, see :meth:`TrainInstruction.deadline`) and within
``patience`` seconds of the first. A refusal (an error with a zone's code) is an answer
and is never retried.

Retrying a push is safe because a push is a transaction at the zone: an attempt that
broke off was either folded whole or not at all. An attempt that did land makes the
retry a duplicate (code ``duplicate``); the zone then says whether it holds *this*
manifest (:class:`~fedshard.errors.HeldPush`): counted (the push succeeded), still
arriving on the earlier stream (wait and ask again), or not at all (a failure).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fedshard.errors import HeldPush, PushRejectedError, RefusalCode, ZoneUnavailableError

__all__ = ["DEFAULT_RETRY", "FETCH_RETRY", "Retry", "held_push"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True)
class Retry:
    """How a site retries a zone call that got no answer.

    Attributes
    ----------
    first:
        Seconds before the second attempt.
    factor:
        Each wait is this many times the one before ...
    cap:
        ... up to this many seconds.
    jitter:
        Each wait is scaled by a random factor in ``[1 − jitter, 1]`` (sites that lost
        the same zone do not all come back at once).
    patience:
        Seconds after the first attempt when no further attempt starts, whatever the deadline.
    """

    first: float = 0.25
    factor: float = 2.0
    cap: float = 4.0
    jitter: float = 0.5
    patience: float = 60.0

    def wait(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.cap, self.first * self.factor ** (attempt - 1))
        return base * (1.0 - self.jitter * (rng or random).random())

    def call(
        self,
        attempt: Callable[[int], _T],
        *,
        deadline: float,
        what: str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> _T:
        """``attempt(n)`` for n = 1, 2, … until it answers, retrying a
        :class:`~fedshard.errors.ZoneUnavailableError` while the next attempt can start
        before ``deadline`` (a :func:`time.monotonic` time) and within :attr:`patience`.

        Raises
        ------
        ZoneUnavailableError
            The last attempt's, once no attempt is left (its message says how many were made).
        FedshardError
            Whatever else an attempt raises (a refusal), at once.
        """
        start = clock()
        n = 1
        while True:
            try:
                return attempt(n)
            except ZoneUnavailableError as exc:
                pause = self.wait(n)
                resume = clock() + pause
                if resume >= deadline or resume - start >= self.patience:
                    if n == 1:
                        raise
                    raise ZoneUnavailableError(f"{exc.reason} (gave up after {n} attempts)", exc.code) from None
                log.info("%s: no answer (%s); attempt %d in %.1fs", what, exc.reason, n + 1, pause)
                sleep(pause)
                n += 1


DEFAULT_RETRY = Retry()
"""How a site retries its pushes (within the round's deadline, at most a minute)."""
FETCH_RETRY = Retry(patience=30.0)
"""How a site retries its fetches of aggregates (no round deadline is known there)."""


def held_push(error: PushRejectedError, attempt: int) -> HeldPush | None:
    """What a push refused with ``error`` on attempt number ``attempt`` means for a retry:
    :attr:`HeldPush.COUNTED` (an earlier attempt landed: success), :attr:`HeldPush.PENDING`
    (an earlier attempt is still arriving: try again), None (a refusal to report).

    Only a retry trusts the zone's word: a first attempt refused as a duplicate is a
    duplicate, whatever the zone says it holds.
    """
    if attempt == 1 or error.code is not RefusalCode.DUPLICATE:
        return None
    return error.held
