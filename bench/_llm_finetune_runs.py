"""The LLM fine-tuning benchmark's settings and runs: what one simulation measured, and the
clock on the task (see ``llm_finetune.py``)."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DELTA",
    "EPSILONS",
    "GAP_GOAL_PP",
    "SHARE_GOAL",
    "TEST_GOAL",
    "Run",
    "Share",
    "TaskClock",
    "no_central",
    "quiet",
]

DELTA = 1e-5
EPSILONS = (8.0, 3.0)
GAP_GOAL_PP, SHARE_GOAL = 0.3, 0.10
TEST_GOAL = 2000


def quiet() -> None:
    """Errors only from logging and no warnings (the bench prints its own progress)."""
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")


@contextlib.contextmanager
def no_central() -> Iterator[None]:
    """``simulate`` without its central baseline (a run whose reference is another run's)."""
    import fedshard.simulate.run as run
    from fedshard.task import Metrics

    original = vars(run)["centralized_baseline"]
    setattr(run, "centralized_baseline", lambda config, rounds=None: Metrics(num_examples=0, loss=0.0))  # noqa: B010
    try:
        yield
    finally:
        setattr(run, "centralized_baseline", original)  # noqa: B010


@dataclass
class TaskClock:
    """Wall-clock spans of every call of the LLM task's ``train`` and ``evaluate``, and the
    streamed bases made meanwhile (their wait counters)."""

    spans: list[tuple[str, float, float]] = field(default_factory=list)
    bases: list[Any] = field(default_factory=list)

    @contextlib.contextmanager
    def installed(self) -> Iterator[TaskClock]:
        from clients.tasks.llm import LlmTask
        from fedshard.store.streamed import StreamedBase

        originals = {name: getattr(LlmTask, name) for name in ("train", "evaluate")}
        base_init = StreamedBase.__init__

        def timed(name: str) -> Any:
            def call(task: Any, *a: Any, **k: Any) -> Any:
                t0 = time.time()
                try:
                    return originals[name](task, *a, **k)
                finally:
                    self.spans.append((name, t0, time.time()))

            return call

        def recording_init(base: Any, *a: Any, **k: Any) -> None:
            base_init(base, *a, **k)
            self.bases.append(base)

        for name in originals:
            setattr(LlmTask, name, timed(name))
        setattr(StreamedBase, "__init__", recording_init)  # noqa: B010
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(LlmTask, name, fn)
            setattr(StreamedBase, "__init__", base_init)  # noqa: B010

    def inside(self, start: float, end: float, kind: str | None = None) -> float:
        """Seconds of [start, end] some task call (of ``kind``) was running (their union)."""
        clipped = sorted(
            (max(a, start), min(b, end))
            for k, a, b in self.spans
            if (kind is None or k == kind) and b > start and a < end
        )
        total, reach = 0.0, start
        for a, b in clipped:
            if b > reach:
                total += b - max(a, reach)
                reach = b
        return total


@dataclass
class Run:
    """One simulation: its summary, seconds, and the bytes it released beyond the adapters."""

    kind: str
    seed: int
    summary: dict[str, Any]
    seconds: float
    adapter_bytes: int
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return float(self.summary["final_accuracy"])

    @property
    def extra_bytes(self) -> int:
        """bytes_up − participating sites × adapter bytes, over every round."""
        return sum(h["bytes_up"] - len(h["sites"]) * self.adapter_bytes for h in self.summary["history"])

    @property
    def bytes_per_site_round(self) -> list[float]:
        return [h["bytes_up"] / len(h["sites"]) for h in self.summary["history"] if h["sites"]]


@dataclass(frozen=True)
class Share:
    """fedshard's share of the share run's last round."""

    round_s: float
    train_s: float
    evaluate_s: float
    wait_s: float
    fetch_s: float
    rounds_s: list[float]
    shares: list[float]

    @property
    def share(self) -> float:
        return self.shares[-1]

    @property
    def wait_share(self) -> float:
        """The training thread's waits for streamed weights, of every round's wall time."""
        return self.wait_s / sum(self.rounds_s)
