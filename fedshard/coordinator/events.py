"""Run events as JSON lines: how a coordinator running elsewhere (a Flower ServerApp)
reports progress to whoever displays it, and the run's permanent record.

The log is also what a resumed coordinator recovers its version chains from
(:mod:`fedshard.coordinator.recovery`): a round's ``closed`` event is written, and
flushed, before any site is told of the round's aggregates, so every round a site can
have applied is in the log. Lines are only appended; an event never changes meaning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Any

from fedshard.coordinator.groups import residency_groups
from fedshard.coordinator.results import RoundResult, RunResult
from fedshard.errors import RefusalCode, RoundError
from fedshard.protocol.messages import SiteInfo

__all__ = ["EventKind", "EventLog", "replay", "round_from_event", "stop_reason"]


class EventKind(StrEnum):
    """What a line of the event log records (its ``event`` field)."""

    START = "start"
    """The federation assembled: its sites, rounds and genesis version; ``resumed`` is the
    last round recovered from the log when the run resumes an earlier one (0: a fresh run)."""
    OPENED = "opened"
    """A round opened at every zone (``round``), before any site was told to train in it."""
    CLOSED = "closed"
    """A round closed at every zone: its RoundResult before evaluation (accuracy and loss NaN),
    written before any site applies it."""
    ROUND = "round"
    """A round finished: the fields of its :class:`~fedshard.coordinator.results.RoundResult`."""
    ABORTED = "aborted"
    """A round was aborted at every zone (a zone failed it); ``round`` and ``reason``."""
    RECONFIGURED = "reconfigured"
    """Before ``round`` the federation changed (``change``: zones added or drained, sites that
    joined; ``joined``: the site ids admitted, ``sites`` their site info, ``groups`` the
    residency groups from then on)."""
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

    def on_start(
        self,
        sites: list[SiteInfo],
        rounds: int,
        genesis_version: str,
        *,
        resumed: int = 0,
        fixed: Mapping[str, str] | None = None,
    ) -> None:
        """Record the assembled federation (``resumed``: the last round recovered, when resuming;
        ``fixed``: digests of the config's fixed parts, which a resume checks)."""
        event: dict[str, Any] = {
            "event": EventKind.START,
            "rounds": rounds,
            "genesis_version": genesis_version,
            "sites": [s.model_dump(mode="json") for s in sites],
            "resumed": resumed,
        }
        if fixed is not None:
            event["fixed"] = dict(fixed)
        self._write(event)

    def on_opened(self, rnd: int) -> None:
        """Record a round opened at every zone, before any site trains (or reserves budget) for it."""
        self._write({"event": EventKind.OPENED, "round": rnd})

    def on_closed(self, result: RoundResult) -> None:
        """Record a round closed at every zone, before any site applies it."""
        self._write({"event": EventKind.CLOSED, **asdict(result)})

    def on_round(self, result: RoundResult) -> None:
        """Record one finished round."""
        self._write({"event": EventKind.ROUND, **asdict(result)})

    def on_aborted(self, rnd: int, reason: str) -> None:
        """Record a round aborted at every zone."""
        self._write({"event": EventKind.ABORTED, "round": rnd, "reason": reason})

    def on_reconfigured(
        self, rnd: int, change: str, joined: Sequence[SiteInfo] = (), groups: Mapping[str, list[str]] | None = None
    ) -> None:
        """Record a change taken before round ``rnd``: the sites that joined, and the residency
        groups from then on (None: unchanged)."""
        event: dict[str, Any] = {"event": EventKind.RECONFIGURED, "round": rnd, "change": change}
        event["joined"] = [s.site_id for s in joined]
        event["sites"] = [s.model_dump(mode="json") for s in joined]
        if groups is not None:
            event["groups"] = {name: list(members) for name, members in groups.items()}
        self._write(event)

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
    """Rebuild the result of the run recorded in ``path``: its last fresh start onwards,
    through every resumption of it."""
    events, _ = EventLog(path).read()
    result: RunResult | None = None
    for event in events:
        if event["event"] == EventKind.START:
            sites = [SiteInfo(**s) for s in event["sites"]]
            groups = {name: [m.site_id for m in members] for name, members in sorted(residency_groups(sites).items())}
            if result is None or not event.get("resumed"):
                result = RunResult(sites, event["genesis_version"], event["genesis_version"], groups=groups)
            else:  # a resumption: the rounds so far stand
                result.sites, result.groups, result.stopped_reason = sites, groups, ""
        elif result is None:
            continue
        elif event["event"] == EventKind.ROUND:
            result.rounds.append(round_from_event(event))
            result.version = result.rounds[-1].version
        elif event["event"] == EventKind.RECONFIGURED:  # sites that joined mid-run
            result.sites = sorted([*result.sites, *(SiteInfo(**s) for s in event.get("sites", []))], key=_site_id)
            result.groups = event.get("groups", result.groups)
        elif event["event"] == EventKind.ABORTED:
            result.aborted.append({"round": event["round"], "reason": event["reason"]})
        elif event["event"] == EventKind.STOP:
            result.stopped_reason = event["reason"]
    if result is None:
        raise RoundError(f"{path}: the run never assembled its sites (no start event)")
    return result


def _site_id(info: SiteInfo) -> str:
    return info.site_id


def stop_reason(path: str | Path) -> str | None:
    """The reason of the last stop event in ``path`` (None: no stop event), for a run that
    stopped before it assembled its sites (e.g. refused sites ahead of its genesis)."""
    events, _ = EventLog(path).read()
    stops = [e for e in events if e["event"] == EventKind.STOP]
    return str(stops[-1]["reason"]) if stops else None


def round_from_event(event: dict[str, Any]) -> RoundResult:
    """Rebuild a RoundResult from its event."""
    fields = {k: v for k, v in event.items() if k not in ("event", "at")}
    fields["sites"] = tuple(fields["sites"])
    fields["refusal_codes"] = {s: RefusalCode.parse(c) for s, c in fields.get("refusal_codes", {}).items()}
    return RoundResult(**fields)
