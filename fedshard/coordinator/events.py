"""Run events as JSON lines: how a coordinator running elsewhere (a Flower ServerApp)
reports progress to whoever displays it, and the run's permanent record.

The log is also what a resumed coordinator recovers its version chains from
(:mod:`fedshard.coordinator.recovery`): a round's ``closed`` event is written, and
flushed, before any site is told of the round's aggregates, so every round a site can
have applied is in the log. Lines are only appended; an event never changes meaning.

A line that is not an event fedshard wrote (not a JSON object with an ``event``, or an
event whose fields do not have their types) is never acted upon: readers skip it
(:attr:`EventLog.skipped`, :func:`replay`), and resuming refuses a log holding one
(:func:`fedshard.coordinator.recovery.recover`). A crash can leave a last line without
its newline: it was never complete, so nothing acted upon it; readers ignore it, and the
first event a resumed coordinator writes cuts it off first (one warning line).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NotRequired

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before Python 3.12

from fedshard.coordinator._groups import residency_groups
from fedshard.coordinator.binding import NodeRefusal
from fedshard.coordinator.results import RoundResult, RunResult
from fedshard.errors import RefusalCode, RoundError
from fedshard.protocol.messages import SiteInfo

__all__ = ["EventKind", "EventLog", "first_error", "replay", "round_from_event", "stop_reason"]

log = logging.getLogger(__name__)


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
    NODE_REFUSED = "node-refused"
    """A node that answered the coordinator's query was refused for the run before ``round``
    (``node``, the ``site_id`` it claimed, ``code``, ``reason``: :mod:`fedshard.coordinator.binding`)."""


class EventLog:
    """A :class:`~fedshard.coordinator.results.RoundObserver` appending to ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.skipped: list[str] = []
        """What :meth:`read` skipped: ``line N: why`` for each line that is not an event."""
        self._lines = {0: 0}  # byte offset -> lines before it (where reads ended)
        self._tail_checked = False

    def _write(self, event: dict[str, Any]) -> None:
        event = {**event, "at": round(time.time(), 3)}  # wall clock, for per-round timings
        if not self._tail_checked:
            self._cut_torn_tail()
        with self.path.open("a") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")
            fh.flush()

    def _cut_torn_tail(self) -> None:
        """Cut a last line a crash left without its newline (never complete: nothing acted on it),
        so the next event starts a line of its own."""
        self._tail_checked = True
        if not self.path.exists():
            return
        with self.path.open("rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            start = max(size - (1 << 20), 0)
            fh.seek(start)
            block = fh.read()
            end = start + block.rfind(b"\n") + 1 if b"\n" in block else 0
            fh.truncate(end)
        log.warning("%s: cut a torn last line (%d bytes) that a crash left", self.path, size - end)

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

    def on_node_refused(self, rnd: int, refusal: NodeRefusal) -> None:
        """Record a node refused for the run before round ``rnd``."""
        self._write({"event": EventKind.NODE_REFUSED, "round": rnd, **refusal.as_event()})

    def read(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Events written since byte ``offset`` (complete lines only); returns them and the new
        offset. Lines that are not events are skipped and described in :attr:`skipped`."""
        if not self.path.exists():
            return [], offset
        with self.path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        line = self._lines.get(offset)
        events = []
        for i, raw in enumerate(complete.splitlines()):
            if not raw.strip():
                continue
            where = f"line {line + i + 1}" if line is not None else f"a line after byte {offset}"
            event, why = _parse(raw)
            if event is None:
                self.skipped.append(f"{where}: {why}")
            else:
                events.append(event)
        end = offset + len(complete)
        if line is not None:
            self._lines[end] = line + complete.count(b"\n")
        return events, end


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """One line as an event, or None and why it is not one."""
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return None, f"not JSON ({str(exc)[:80]})"
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return None, "not an event (a JSON object with an event kind)"
    return event, ""


def _finite_or_nan(value: float) -> float:
    if math.isinf(value):
        raise ValueError("must be finite (or NaN: not measured)")
    return value


_Measure = Annotated[float, AfterValidator(_finite_or_nan)]
_Count = Annotated[int, Field(ge=0)]
_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Traffic(TypedDict):
    bytes: _Count
    shards: dict[str, _Count]


class _Timings(TypedDict, total=False):
    round: _Seconds
    coordinator: dict[str, _Seconds]
    zones: dict[str, dict[str, _Seconds]]
    sites: dict[str, dict[str, _Seconds]]


class _Aggregate(TypedDict):
    zone: str
    group: str
    merkle_root: NotRequired[str]
    shards: NotRequired[_Count]
    sites: NotRequired[list[str]]


class _Privacy(TypedDict):
    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]  # the report's other fields stand
    epsilon_spent: _Finite
    epsilon_budget: _Finite
    status: str


class _RoundEvent(TypedDict):
    """A ``closed`` or ``round`` event's fields, with the types the report and resuming rely on."""

    round: int
    version: str
    merkle_root: str
    sites: list[str]
    refused: dict[str, str]
    train_loss: _Measure
    accuracy: _Measure
    loss: _Measure
    bytes_up: _Count
    privacy: NotRequired[dict[str, _Privacy]]
    versions: NotRequired[dict[str, str]]
    roots: NotRequired[dict[str, str]]
    aggregates: NotRequired[list[_Aggregate]]
    refusal_codes: NotRequired[dict[str, str]]
    timings: NotRequired[_Timings]
    traffic: NotRequired[dict[str, _Traffic]]
    excluded: NotRequired[dict[str, str]]
    excluded_codes: NotRequired[dict[str, list[str]]]


class _StartEvent(TypedDict):
    sites: list[SiteInfo]
    genesis_version: str
    resumed: NotRequired[int]


class _ReconfiguredEvent(TypedDict):
    round: int
    change: str
    joined: NotRequired[list[str]]
    sites: NotRequired[list[SiteInfo]]
    groups: NotRequired[dict[str, list[str]]]


class _ReasonEvent(TypedDict):  # aborted (with its round) and stop
    round: NotRequired[int]
    reason: str


class _NodeRefusedEvent(TypedDict):
    node: str
    site_id: str
    code: str
    reason: str


_ROUND = TypeAdapter(_RoundEvent)
_ROUND_FIELDS = frozenset(f.name for f in fields(RoundResult))
_START = TypeAdapter(_StartEvent)
_RECONFIGURED = TypeAdapter(_ReconfiguredEvent)
_REASON = TypeAdapter(_ReasonEvent)
_NODE_REFUSED = TypeAdapter(_NodeRefusedEvent)


def replay(path: str | Path, skipped: list[str] | None = None) -> RunResult:
    """Rebuild the result of the run recorded in ``path``: its last fresh start onwards,
    through every resumption of it.

    Lines that are not events, and events whose fields do not have the types fedshard
    writes, are skipped: each is described in ``skipped`` (when given; else logged).

    Raises
    ------
    RoundError
        The log holds no (readable) start event: the run never assembled its sites.
    """
    reader = EventLog(path)
    events, _ = reader.read()
    notes = list(reader.skipped)
    result: RunResult | None = None
    for event in events:
        try:
            result = _apply(result, event)
        except ValidationError as exc:
            notes.append(f"a {event['event'][:32]!r} event: {first_error(exc)}")
    if skipped is not None:
        skipped.extend(notes)
    else:
        for note in notes:
            log.warning("%s: skipped %s", path, note)
    if result is None:
        raise RoundError(f"{path}: the run never assembled its sites (no start event)")
    return result


def _apply(result: RunResult | None, event: dict[str, Any]) -> RunResult | None:
    """``result`` with ``event`` replayed onto it (raises ValidationError for a malformed event)."""
    kind = event["event"]
    at = event.get("at")
    at = float(at) if isinstance(at, int | float) and not isinstance(at, bool) and math.isfinite(at) else None
    if kind == EventKind.START:
        start = _START.validate_python(event)
        sites = start["sites"]
        groups = {name: [m.site_id for m in members] for name, members in sorted(residency_groups(sites).items())}
        if result is None or not start.get("resumed"):
            genesis = start["genesis_version"]
            return RunResult(sites, genesis, genesis, groups=groups, started_at=at, last_at=at)
        result.sites, result.groups, result.stopped_reason = sites, groups, ""  # a resumption: the rounds stand
        result.last_at = at or result.last_at
        return result
    if result is None:
        return None
    result.last_at = at or result.last_at
    if kind == EventKind.ROUND:
        result.rounds.append(round_from_event(event))
        result.version = result.rounds[-1].version
    elif kind == EventKind.RECONFIGURED:  # sites that joined mid-run
        change = _RECONFIGURED.validate_python(event)
        result.sites = sorted([*result.sites, *change.get("sites", [])], key=_site_id)
        result.groups = change.get("groups", result.groups)
        joined = change.get("joined", [])
        result.changes.append({"round": change["round"], "change": change["change"], "joined": joined})
    elif kind == EventKind.ABORTED:
        aborted = _REASON.validate_python(event)
        result.aborted.append({"round": aborted.get("round", 0), "reason": aborted["reason"]})
    elif kind == EventKind.STOP:
        result.stopped_reason = _REASON.validate_python(event)["reason"]
    elif kind == EventKind.NODE_REFUSED:
        result.refused_nodes.append(dict(_NODE_REFUSED.validate_python(event)))
    return result


def first_error(exc: ValidationError) -> str:
    """The first problem pydantic found, in one short line."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))[:80]
    return f"{where or 'event'}: {str(first.get('msg', 'invalid'))[:120]}"


def _site_id(info: SiteInfo) -> str:
    return info.site_id


def stop_reason(path: str | Path) -> str | None:
    """The reason of the last stop event in ``path`` (None: no stop event), for a run that
    stopped before it assembled its sites (e.g. refused sites ahead of its genesis)."""
    events, _ = EventLog(path).read()
    stops = [e for e in events if e["event"] == EventKind.STOP and isinstance(e.get("reason"), str)]
    return str(stops[-1]["reason"]) if stops else None


def round_from_event(event: dict[str, Any]) -> RoundResult:
    """Rebuild a RoundResult from its event.

    Raises
    ------
    pydantic.ValidationError
        A field is missing or does not have the type fedshard writes (a ValueError).
    """
    _ROUND.validate_python(event, strict=True)  # the types are right: the values are taken as logged
    fields = {k: v for k, v in event.items() if k in _ROUND_FIELDS}
    fields["sites"] = tuple(fields["sites"])
    fields["refusal_codes"] = {s: RefusalCode.parse(c) for s, c in fields.get("refusal_codes", {}).items()}
    fields["excluded_codes"] = {
        s: tuple(RefusalCode.parse(c) for c in codes) for s, codes in fields.get("excluded_codes", {}).items()
    }
    return RoundResult(**fields)
