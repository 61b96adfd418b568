"""Where the time of a round goes: the phases a site reports, and the clock that times them.

A site reports its own seconds per phase with every train and evaluate reply
(:class:`PhaseTimes`); a zone reports, in each push's receipt, the seconds it spent
folding the push into the round's sums. The coordinator adds what it saw itself (how
long it waited for each step, how long each zone took to close) and logs it all with
the round (:class:`~fedshard.coordinator.results.RoundResult` ``timings``).

These figures are for people (the run report, metrics). Nothing decides on them, so
a site that lies about its own times misleads only its own line of the report; each
is bounded (finite, non-negative, at most :data:`MAX_PHASE_S`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, ParamSpec, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MAX_PHASE_S", "Phase", "PhaseSeconds", "PhaseTimes", "Stopwatch"]

P = ParamSpec("P")
R = TypeVar("R")

MAX_PHASE_S = 7 * 86400.0
"""The longest a reported phase may take (a week); longer is refused as a malformed reply."""

PhaseSeconds = Annotated[float, Field(ge=0.0, le=MAX_PHASE_S, allow_inf_nan=False)]
"""Seconds of one phase as a message carries them."""


class Phase(StrEnum):
    """The phases of a round, in the order a round goes through them (see README, "See a run")."""

    OPEN = "open"
    """The coordinator opens the round at every zone."""
    FETCH = "fetch"
    """A site downloads the aggregates of the rounds it applies (before training, or to evaluate)."""
    APPLY = "apply"
    """A site checks, decrypts and applies those aggregates to its shards."""
    TRAIN = "train"
    """A site trains on its records (DP-SGD included)."""
    SEAL = "seal"
    """A site noises and encrypts its update."""
    PUSH = "push"
    """A site streams its shards to its zones, until every zone acknowledged (the zones' fold included)."""
    FOLD = "fold"
    """A zone folds a push into the round's sums (zone-reported, in the push's receipt)."""
    CLOSE = "close"
    """A zone closes the round: forwards partial sums, publishes its aggregates (coordinator-timed)."""
    EVALUATE = "evaluate"
    """A site evaluates the model on its test records."""


class PhaseTimes(BaseModel):
    """A site's seconds per phase in one reply (train: fetch, apply, train, seal, push;
    evaluate: fetch, apply, evaluate). Sent by: the site, about itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fetch_s: PhaseSeconds = 0.0
    apply_s: PhaseSeconds = 0.0
    train_s: PhaseSeconds = 0.0
    seal_s: PhaseSeconds = 0.0
    push_s: PhaseSeconds = 0.0
    evaluate_s: PhaseSeconds = 0.0

    def as_dict(self) -> dict[str, float]:
        """The phases that took any time, ``{"train": 0.41, ...}`` (milliseconds kept)."""
        return {name.removesuffix("_s"): round(v, 4) for name, v in self.model_dump().items() if v > 0}


class Stopwatch:
    """Seconds per phase, added up over every time a phase is timed. A phase timed inside
    another counts as itself only: every second lands in the innermost phase (one thread)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._inner: list[float] = []  # per open phase: the seconds of the phases nested in it

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (added to earlier blocks of the same name), less the
        phases timed inside it."""
        start = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            nested = self._inner.pop()
            if self._inner:
                self._inner[-1] += elapsed
            self.add(name, elapsed - nested)

    def timed(self, name: str, call: Callable[P, R]) -> Callable[P, R]:
        """``call``, each of its calls timed as phase ``name``."""

        def timed_call(*args: P.args, **kwargs: P.kwargs) -> R:
            with self.phase(name):
                return call(*args, **kwargs)

        return timed_call

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to phase ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + max(seconds, 0.0)

    def times(self) -> PhaseTimes:
        """The site phases as a message carries them (other names are left out)."""
        fields = PhaseTimes.model_fields
        return PhaseTimes(**{f"{k}_s": min(v, MAX_PHASE_S) for k, v in self.seconds.items() if f"{k}_s" in fields})
