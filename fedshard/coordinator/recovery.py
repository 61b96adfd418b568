"""Resuming a federation after its coordinator died: what the run folder's event log holds.

A coordinator writes a round's ``closed`` event (its aggregates' Merkle roots, each
residency group's root and version) before it tells any site of the round, and its
``round`` event once the sites have applied and evaluated it (with the next round's train
messages, so after that round's ``opened``; the last round alone: :mod:`fedshard.coordinator.events`,
:mod:`fedshard.coordinator.coordinator`). So the log holds every round a site can have
applied, and a resumed coordinator rebuilds from it:

* each residency group's version chain, through the last closed round (the rounds a
  site that is behind still has to apply, as :class:`~fedshard.protocol.messages.AppliedRound`);
* the results of the finished rounds (for the summary);
* a round that closed but was not evaluated (finish it: the sites apply it);
* the next round to run. A round that was open when the coordinator died, and never
  closed, is run again under its number (nothing of it was applied anywhere), except
  with differential privacy on: sites may have charged it to their ledgers, where a
  round is charged once, so the coordinator logs it as aborted and goes on with the
  next number.

What the sites report at discovery is then checked against the chain
(:func:`check_standing`): a site must hold the group's model of the round it last
applied. A fresh run on sites that hold a later model is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedshard.config import FederationConfig
from fedshard.config.changes import check_fixed
from fedshard.coordinator._replies import Excluded, left_out
from fedshard.coordinator.events import EventKind, EventLog, first_error, round_from_event
from fedshard.coordinator.results import RoundResult
from fedshard.errors import RoundError
from fedshard.integrity import next_version
from fedshard.protocol.messages import AppliedRound, PublishedAggregate, SiteInfo

__all__ = ["RunRecovery", "check_standing", "recover"]

RESUME_HINT = (
    "go on with the run that trained them: `fedshard aggregator up --resume` (or `fedshard simulate --resume "
    "RUN_DIR`), with `--rounds N` to train on after it finished; never delete a site's state folder: it holds the "
    "site's privacy ledger"
)


@dataclass
class RunRecovery:
    """What a run folder's event log says about the run to resume.

    ``closed`` holds every round that closed at the zones, in order, as the RoundResult
    logged at close; ``finished`` the round numbers whose ``round`` event was logged.
    """

    path: Path
    genesis_version: str
    closed: list[RoundResult] = field(default_factory=list)
    finished: dict[int, RoundResult] = field(default_factory=dict)
    aborted: list[dict[str, object]] = field(default_factory=list)
    opened: set[int] = field(default_factory=set)
    fixed: dict[str, str] = field(default_factory=dict)  # the config's fixed parts as the run last started
    completed: bool = False  # the log ends with the run's own "completed" stop (not a crash, not a stop reason)

    def check_config(self, config: FederationConfig, source: str) -> None:
        """Refuse, in one line, a config to resume with that changes what the run keeps fixed (what
        ``reconfigure`` would refuse: privacy, residency, a zone's region or endpoint, …); a
        log of an earlier fedshard, which recorded nothing, is not checked."""
        if self.fixed:
            check_fixed(self.fixed, config, source)

    @property
    def last_round(self) -> int:
        """The last round that closed (0: none)."""
        return self.closed[-1].round if self.closed else 0

    @property
    def next_round(self) -> int:
        """The first round the resumed run opens: after the last one closed or aborted."""
        aborted = [int(str(a["round"])) for a in self.aborted]
        return max([self.last_round, *aborted]) + 1

    @property
    def in_flight(self) -> int | None:
        """The round open at the zones when the coordinator died (neither closed nor aborted), if any."""
        done = {r.round for r in self.closed} | {int(str(a["round"])) for a in self.aborted}
        left = [r for r in self.opened if r not in done and r > self.last_round]
        return max(left) if left else None

    @property
    def unfinished(self) -> RoundResult | None:
        """A round that closed but was never evaluated (at most the last one)."""
        if self.closed and self.closed[-1].round not in self.finished:
            return self.closed[-1]
        return None

    @property
    def group_names(self) -> set[str]:
        """The residency groups the last closed round recorded (empty: none closed)."""
        return set(self.closed[-1].roots) if self.closed else set()

    def check_more_to_do(self, rounds: int, how: str) -> None:
        """Refuse, in one line, to resume a run that completed when ``rounds`` (the config's
        ``federation.rounds``) asks for none beyond those it ran: nothing would run, and its
        record would be written again. ``how``: the command that trains on (more rounds)."""
        if self.completed and rounds <= self.last_round:
            raise RoundError(
                f"the run in {self.path.parent} finished its {self.last_round} rounds: nothing to resume, nothing "
                f"was changed; to train on with the same sites, models and ledgers: {how}"
            )

    def results(self) -> list[RoundResult]:
        """The finished rounds' results, in order."""
        return [self.finished[r.round] for r in self.closed if r.round in self.finished]

    def chain(self, group: str) -> list[AppliedRound]:
        """Group ``group``'s applied rounds, oldest first.

        Raises
        ------
        RoundError
            The log does not know the group (the sites' residency routes changed).
        """
        out = []
        for r in self.closed:
            if group not in r.roots:
                raise RoundError(
                    f"{self.path}: round {r.round} recorded no residency group {group!r} "
                    f"(groups {', '.join(sorted(r.roots))}); the sites' residency routes differ from the run's, "
                    "so it cannot be resumed"
                )
            announced = [
                PublishedAggregate(zone=str(a["zone"]), group=str(a["group"]), merkle_root=str(a["merkle_root"]))
                for a in r.aggregates
            ]
            out.append(AppliedRound(round=r.round, merkle_root=r.roots[group], aggregates=announced))
        return out

    def versions(self, group: str) -> dict[int, str]:
        """Round → group ``group``'s model version after it (0: genesis), recomputed from the roots."""
        version = self.genesis_version
        out = {0: version}
        for applied in self.chain(group):
            version = next_version(version, applied.merkle_root)
            out[applied.round] = version
        return out


def recover(path: str | Path) -> RunRecovery:
    """Read the run recorded in ``path`` (an ``events.jsonl``) for resuming it.

    Raises
    ------
    RoundError
        No log, or one that never assembled its sites, or a closed round without the
        aggregates' roots (written by an earlier fedshard): start over instead.
    """
    path = Path(path)
    if not path.exists():
        raise RoundError(f"{path} does not exist: there is no run to resume in that folder")
    reader = EventLog(path)
    events, _ = reader.read()
    if reader.skipped:
        raise RoundError(f"{path}: {reader.skipped[0]}; {_UNTRUSTED}")
    recovery: RunRecovery | None = None
    for event in events:
        try:
            recovery = _recover(recovery, event, path)
        except (ValidationError, TypeError, ValueError) as exc:
            why = first_error(exc) if isinstance(exc, ValidationError) else str(exc)[:120]
            raise RoundError(
                f"{path}: a {event['event'][:32]!r} event does not hold what fedshard writes ({why}); {_UNTRUSTED}"
            ) from None
    if recovery is None:
        raise RoundError(f"{path}: the run never assembled its sites (no start event); start a fresh run instead")
    return recovery


_UNTRUSTED = (
    "this log cannot be resumed from (fedshard never writes such a line; a crash leaves at most a torn last "
    "line, which is ignored): restore events.jsonl from a backup, or start a fresh run; nothing was changed"
)


def _recover(recovery: RunRecovery | None, event: dict[str, Any], path: Path) -> RunRecovery | None:
    """``recovery`` with ``event`` taken in (raises ValidationError, TypeError or ValueError for a malformed one)."""
    kind = event["event"]
    if kind == EventKind.START:
        if recovery is None or not event.get("resumed"):
            genesis = event.get("genesis_version")
            if not isinstance(genesis, str):
                raise ValueError("a start event without its genesis version")
            recovery = RunRecovery(path, genesis)
        fixed = event.get("fixed")
        if fixed is not None:
            if not isinstance(fixed, dict):
                raise ValueError("a start event whose fixed config digests are not a mapping")
            recovery.fixed = {str(k): str(v) for k, v in fixed.items()}
        return recovery
    if recovery is None:
        return recovery
    recovery.completed = kind == EventKind.STOP and not event.get("reason")
    if kind == EventKind.STOP:
        return recovery
    rnd = event.get("round", 0)
    if not isinstance(rnd, int):
        raise ValueError(f"round {str(rnd)[:20]!r} is not a number")
    if kind == EventKind.OPENED:
        recovery.opened.add(rnd)
    elif kind == EventKind.CLOSED:
        result = round_from_event(event)
        if any("merkle_root" not in a for a in result.aggregates):
            raise RoundError(f"{path}: round {rnd} was logged without its aggregates' roots; it cannot be resumed")
        recovery.closed = [r for r in recovery.closed if r.round != rnd] + [result]
    elif kind == EventKind.ROUND:
        recovery.finished[rnd] = round_from_event(event)
    elif kind == EventKind.ABORTED:
        if not isinstance(event.get("reason"), str):
            raise ValueError("an aborted event without its reason")
        recovery.aborted.append({"round": rnd, "reason": event["reason"]})
    return recovery


def in_flight_reason(rnd: int) -> str:
    """Why round ``rnd``, open when the coordinator died, is not run again (DP on)."""
    return (
        f"round {rnd}: the coordinator stopped while it was open; sites may have charged it to their "
        "privacy ledgers, where a round is charged once, so it is not run again"
    )


def evaluated(
    result: RoundResult,
    accuracy: float,
    loss: float,
    timings: dict[str, Any] | None = None,
    excluded: Mapping[str, Excluded] | None = None,
) -> RoundResult:
    """``result`` (logged at close) with the sites' evaluation (and the round's timings, and the
    evaluate replies left out, with it)."""
    lines, codes = left_out(result.excluded, result.excluded_codes, excluded or {})
    return replace(
        result,
        accuracy=accuracy,
        loss=loss,
        timings=result.timings if timings is None else timings,
        excluded=lines,
        excluded_codes=codes,
    )


def check_standing(sites: list[SiteInfo], group_of: dict[str, str], genesis: str, recovery: RunRecovery | None) -> None:
    """Refuse, in one line, sites whose model the run (or the fresh run's genesis) does not lead to.

    Without ``recovery`` (a fresh run), a site that applied any round holds a later model
    than genesis. With it, a site must hold its group's model of the round it last
    applied, and not be ahead of the log.

    Raises
    ------
    RoundError
        Naming every such site and what it holds, and how to go on.
    """
    if recovery is None:
        ahead = [s for s in sites if s.applied_round > 0]
        if ahead:
            held = ", ".join(f"{s.site_id} holds round {s.applied_round} ({s.version[:12]}…)" for s in ahead)
            raise RoundError(f"the sites' stores hold a later model than this run's genesis: {held}; {RESUME_HINT}")
        return
    if recovery.genesis_version != genesis:
        raise RoundError(
            f"cannot resume the run in {recovery.path.parent}: it started from model "
            f"{recovery.genesis_version[:12]}…, the sites from {genesis[:12]}… (another model or seed); "
            "resume from their run's folder"
        )
    bad = []
    for s in sites:
        versions = recovery.versions(group_of[s.site_id])
        expected = versions.get(s.applied_round)
        if expected is None and s.applied_round > recovery.last_round:
            bad.append(
                f"{s.site_id} holds round {s.applied_round}, after the last round logged ({recovery.last_round})"
            )
        elif expected != s.version:
            bad.append(f"{s.site_id}'s model of round {s.applied_round} is not the run's ({s.version[:12]}…)")
    if bad:
        raise RoundError(
            f"cannot resume the run in {recovery.path.parent}: {'; '.join(bad)}; "
            "resume from the run folder that trained these sites"
        )
