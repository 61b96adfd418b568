"""Retrying a zone call that got no answer: exponential backoff with jitter, within the round
(the loop is tenacity's; when to stop and how long to wait are the site's).

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

import itertools
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
        from tenacity import RetryCallState, Retrying, retry_if_exception_type

        start = clock()
        pauses: dict[int, float] = {}

        def pause(state: RetryCallState) -> float:
            """The wait after attempt n, drawn once (tenacity asks for it, and the stop needs it)."""
            n = state.attempt_number
            if n not in pauses:
                pauses[n] = self.wait(n)
            return pauses[n]

        def give_up(state: RetryCallState) -> bool:
            """After attempt n failed with no answer: stop unless the next can start in time."""
            resume = clock() + pause(state)
            return resume >= deadline or resume - start >= self.patience

        def say(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            reason = error.reason if isinstance(error, ZoneUnavailableError) else str(error)
            n = state.attempt_number
            log.info("%s: no answer (%s); attempt %d in %.1fs", what, reason, n + 1, pauses[n])

        retrying = Retrying(
            retry=retry_if_exception_type(ZoneUnavailableError),  # a refusal is an answer: raised at once
            stop=give_up,
            wait=pause,
            sleep=sleep,
            before_sleep=say,
            reraise=True,
        )
        numbers = itertools.count(1)
        try:
            return retrying(lambda: attempt(next(numbers)))
        except ZoneUnavailableError as exc:
            made = int(retrying.statistics.get("attempt_number", 1))
            if made == 1:
                raise
            raise ZoneUnavailableError(f"{exc.reason} (gave up after {made} attempts)", exc.code) from None


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
