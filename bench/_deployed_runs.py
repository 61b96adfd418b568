"""One run on a started aggregator host (``AggregatorHost``): plain Flower FedAvg
(``bench/flower_fedavg``) or the fedshard app, and when each of its rounds ended; shared by
``deploy_overhead.py`` (one loopback host) and ``wan.py`` (hosts on shaped links)."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshard.coordinator.events import EventKind
from fedshard.deploy.app import write_run_config

BENCH = Path(__file__).resolve().parent
FINISHED = ("finished:completed", "finished:failed", "finished:stopped")


@dataclass(frozen=True)
class RoundMarks:
    """When a run started its first round and ended each round (``time.time()``), and its final accuracy."""

    marks: list[float]
    accuracy: float

    @property
    def times(self) -> list[float]:
        """Each round's wall time."""
        return [b - a for a, b in itertools.pairwise(self.marks)]


def flower_rounds(host: Any, federation: Path, folder: Path, rounds: int, tag: str) -> RoundMarks:
    """Plain Flower FedAvg for ``rounds`` on ``host``'s SuperNodes (the task of ``federation``)."""
    times = folder / f"flower-times-{tag}.jsonl"
    config = folder / f"flower-run-{tag}.toml"
    write_run_config(config, {"config": str(federation), "times": str(times), "rounds": str(rounds)})
    run_id = host.flwr.submit(BENCH / "flower_fedavg", config)
    while host.flwr.run_status(run_id) not in FINISHED:
        time.sleep(0.5)
    lines = [json.loads(line) for line in times.read_text().splitlines()]
    done = next(x for x in lines if x.get("done"))
    last = done["metrics"][str(max(int(r) for r in done["metrics"]))]
    return RoundMarks([x["at"] for x in lines if "round" in x], float(last["accuracy"]))


def fedshard_rounds(host: Any) -> RoundMarks:
    """The fedshard run of ``host``'s config on its SuperNodes; its rounds end as they close.

    A round's train messages carry the evaluation of the round before, so the time between two
    rounds' ``closed`` events is one whole round (open, train with the evaluation carried, close);
    its ``round`` event is logged within the next round. The run's last round is evaluated alone,
    once per run, after the last close: no round's time includes it."""
    summary = host.run()
    events = [json.loads(line) for line in (host.run_dir / "events.jsonl").read_text().splitlines()]
    if not summary or summary["stopped_reason"]:
        reason = summary.get("stopped_reason") or [e.get("reason") for e in events if e["event"] == EventKind.STOP]
        raise RuntimeError(f"the fedshard run in {host.run_dir} did not complete: {reason}")
    marks = [e["at"] for e in events if e["event"] in (EventKind.START, EventKind.CLOSED)]
    return RoundMarks(marks, float(summary["final_accuracy"]))
