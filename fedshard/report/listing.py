"""``fedshard runs``: the runs under a folder, one line each: when each started, how far it
got and how it ended, read from its own records (event log, ``summary.json``; for a run
without a summary, the caller may say more, e.g. whether a deployed run's aggregator
still holds its state folder's lock). A ``fedshard tune`` folder is one line too: its
candidates' runs together, and the candidate it chose (``tune.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from fedshard.errors import FedshardError
from fedshard.run_folder.tune_folder import CANDIDATES_DIR, TUNE_FILE

__all__ = ["RunListing", "list_runs"]


@dataclass(frozen=True)
class RunListing:
    """One run folder, as ``fedshard runs`` lists it."""

    folder: Path
    federation: str
    started: str  # UTC, "" where the log records no time
    rounds: int  # rounds finished
    planned: int | None  # federation.rounds of its config (None: unknown)
    accuracy: float | None  # after its last round
    status: str  # finished, stopped: <why>, running, no summary (running, or it died), unreadable: <why>

    def as_dict(self) -> dict[str, Any]:
        """Plain data (``--json``)."""
        return {
            "folder": str(self.folder),
            "federation": self.federation,
            "started": self.started,
            "rounds": self.rounds,
            "planned": self.planned,
            "accuracy": self.accuracy,
            "status": self.status,
        }


def list_runs(folder: Path, unfinished: Callable[[Path], str | None] | None = None) -> list[RunListing]:
    """Every run directly under ``folder`` (a folder holding ``events.jsonl``), oldest first.
    A run whose records cannot be read is listed as unreadable, never skipped in silence.
    ``unfinished``: what to say of a run without a summary (None: nothing known)."""
    from fedshard.report._run import load_run

    found = sorted(p.parent for p in folder.glob("*/events.jsonl"))
    out = []
    for run_dir in found:
        planned = _planned(run_dir)
        try:
            run = load_run(run_dir)
        except FedshardError as exc:
            out.append(RunListing(run_dir, "?", "", 0, planned, None, f"unreadable: {exc}"))
            continue
        started = run.result.started_at
        when = datetime.fromtimestamp(started, tz=UTC).strftime("%Y-%m-%d %H:%M UTC") if started else ""
        last = run.rounds[-1].accuracy if run.rounds else None
        status = _status(run_dir, run.summary, unfinished)
        out.append(RunListing(run_dir, run.name, when, len(run.rounds), planned, last, status))
    out += [_tuning(tune_dir) for tune_dir in sorted({p.parent for p in folder.glob(f"*/{CANDIDATES_DIR}")})]
    return sorted(out, key=lambda r: (r.started, r.folder.name))


def _tuning(tune_dir: Path) -> RunListing:
    """A ``fedshard tune`` folder: its candidate runs' rounds together, started with the first; no
    accuracy (the candidates' own are on their validation split, not a result); the chosen one."""
    candidates = list_runs(tune_dir / CANDIDATES_DIR)
    started = min((c.started for c in candidates if c.started), default="")
    rounds = sum(c.rounds for c in candidates)
    known = [c.planned for c in candidates]
    planned = sum(p for p in known if p is not None) if known and None not in known else None
    federation = candidates[0].federation if candidates else "?"
    try:
        found = json.loads((tune_dir / TUNE_FILE).read_text())
    except FileNotFoundError:
        status = f"tuning: {len(candidates)} candidate run(s), no {TUNE_FILE} (running, or it died)"
    except (OSError, ValueError) as exc:
        status = f"unreadable: {TUNE_FILE}: {exc}"
    else:
        chosen = found.get("chosen") if isinstance(found, dict) else None
        federation = str(found.get("federation", federation)) if isinstance(found, dict) else federation
        status = f"tuned: chose {chosen}" if chosen else "tuned: no candidate finished"
    return RunListing(tune_dir, federation, started, rounds, planned, None, status)


def _status(run_dir: Path, summary: dict[str, Any], unfinished: Callable[[Path], str | None] | None) -> str:
    if summary:
        reason = summary.get("stopped_reason")
        return f"stopped: {reason}" if reason else "finished"
    said = unfinished(run_dir) if unfinished is not None else None
    return said or "no summary (running, or it died)"


def _planned(run_dir: Path) -> int | None:
    try:
        config = yaml.safe_load((run_dir / "federation.yaml").read_text())
        return int(config["federation"]["rounds"])
    except (OSError, yaml.YAMLError, TypeError, KeyError, ValueError):
        return None
