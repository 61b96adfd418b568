"""Run events as JSON lines: how a coordinator running elsewhere (a Flower ServerApp)
reports progress to whoever displays it, and the run's permanent record."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Any

from fedshard.coordinator.groups import residency_groups
from fedshard.coordinator.results import RoundResult, RunResult
from fedshard.errors import RefusalCode, RoundError
from fedshard.protocol.messages import SiteInfo

__all__ = ["EventKind", "EventLog", "replay", "round_from_event"]


class EventKind(StrEnum):
    """What a line of the event log records (its ``event`` field)."""

    START = "start"
    """The federation assembled: its sites, rounds and genesis version."""
    ROUND = "round"
    """A round finished: the fields of its :class:`~fedshard.coordinator.results.RoundResult`."""
    STOP = "stop"
    """The run ended: ``reason`` is empty when it completed."""


class EventLog:
    """A :class:`~fedshard.coordinator.results.RoundObserver` appending to ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, event: dict[str, Any]) -> None:
        event = {**event, "at": round(time.time(), 3)}  # wall clock, for per-round timings
        with self.path.open("a") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")
            fh.flush()

    def on_start(self, sites: list[SiteInfo], rounds: int, genesis_version: str) -> None:
        """Record the assembled federation."""
        self._write(
            {
                "event": EventKind.START,
                "rounds": rounds,
                "genesis_version": genesis_version,
                "sites": [s.model_dump(mode="json") for s in sites],
            }
        )

    def on_round(self, result: RoundResult) -> None:
        """Record one finished round."""
        self._write({"event": EventKind.ROUND, **asdict(result)})

    def on_stop(self, reason: str) -> None:
        """Record the end of the run (empty reason: completed)."""
        self._write({"event": EventKind.STOP, "reason": reason})

    def read(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Events written since byte ``offset``; returns them and the new offset."""
        if not self.path.exists():
            return [], offset
        with self.path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        events = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return events, offset + len(complete)


def replay(path: str | Path) -> RunResult:
    """Rebuild the result of the run recorded in ``path`` (its last start onwards)."""
    events, _ = EventLog(path).read()
    starts = [i for i, e in enumerate(events) if e["event"] == EventKind.START]
    if not starts:
        raise RoundError(f"{path}: the run never assembled its sites (no start event)")
    start = events[starts[-1]]
    sites = [SiteInfo(**s) for s in start["sites"]]
    result = RunResult(
        sites=sites,
        genesis_version=start["genesis_version"],
        version=start["genesis_version"],
        groups={name: [m.site_id for m in members] for name, members in sorted(residency_groups(sites).items())},
    )
    for event in events[starts[-1] + 1 :]:
        if event["event"] == EventKind.ROUND:
            result.rounds.append(round_from_event(event))
            result.version = result.rounds[-1].version
        elif event["event"] == EventKind.STOP:
            result.stopped_reason = event["reason"]
    return result


def round_from_event(event: dict[str, Any]) -> RoundResult:
    """Rebuild a RoundResult from its event."""
    fields = {k: v for k, v in event.items() if k not in ("event", "at")}
    fields["sites"] = tuple(fields["sites"])
    fields["refusal_codes"] = {s: RefusalCode.parse(c) for s, c in fields.get("refusal_codes", {}).items()}
    return RoundResult(**fields)
