"""``fedshard runs``: the runs under a folder, one line each: when each started, how far it
got and how it ended, read from its own records (event log, ``summary.json``, and for a
deployed run whether its aggregator still holds the state folder's lock)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from fedshard.errors import FedshardError

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


def list_runs(folder: Path) -> list[RunListing]:
    """Every run directly under ``folder`` (a folder holding ``events.jsonl``), oldest first.
    A run whose records cannot be read is listed as unreadable, never skipped in silence."""
    from fedshard.report.run import load_run

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
        out.append(RunListing(run_dir, run.name, when, len(run.rounds), planned, last, _status(run_dir, run.summary)))
    return sorted(out, key=lambda r: (r.started, r.folder.name))


def _status(run_dir: Path, summary: dict[str, Any]) -> str:
    if summary:
        reason = summary.get("stopped_reason")
        return f"stopped: {reason}" if reason else "finished"
    from fedshard.deploy.host_lock import is_held
    from fedshard.deploy.status import STATUS_FILE, read_state

    host = run_dir.parent
    if (host / STATUS_FILE).exists():  # a deployed run: its aggregator's lock says whether it runs
        try:
            current = read_state(host).run_dir == str(run_dir)
        except FedshardError:
            current = False
        if current and is_held(host):
            return "running"
        return "no summary: its aggregator died (`aggregator up --resume` goes on)" if current else "no summary"
    return "no summary (running, or it died)"


def _planned(run_dir: Path) -> int | None:
    try:
        config = yaml.safe_load((run_dir / "federation.yaml").read_text())
        return int(config["federation"]["rounds"])
    except (OSError, yaml.YAMLError, TypeError, KeyError, ValueError):
        return None
