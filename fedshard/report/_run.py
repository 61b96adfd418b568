"""What a run folder says about its run, as the report reads it: the event log (every
run has one, finished or not), and ``summary.json`` where the run wrote it (the zones'
own counters, the central baseline).

Nothing read is trusted to have the shape fedshard writes: a line of the event log that is
not an event, an event whose fields have other types, a zone entry of ``summary.json``
that is not one, and traffic reported for a zone the run's config does not have are left
out, each noted in :attr:`RunRecord.skipped` (the report lists them; ``fedshard report``
says how many in one line)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import (
    Any,
    NotRequired,  # pydantic reads TypedDicts from here before Python 3.12
)

import yaml
from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from fedshard.coordinator.events import replay
from fedshard.coordinator.results import RoundResult, RunResult
from fedshard.errors import ConfigError, FedshardError

__all__ = ["RunRecord", "load_run"]


@dataclass
class RunRecord:
    """A run as the report shows it."""

    folder: Path
    result: RunResult
    summary: dict[str, Any] = field(default_factory=dict)  # empty: the run wrote none (yet)
    configured_regions: dict[str, str] = field(default_factory=dict)  # zone -> region, from federation.yaml
    skipped: list[str] = field(default_factory=list)  # what was left out as malformed, one line each

    @property
    def name(self) -> str:
        """The federation's name (the folder's, before the run wrote its summary)."""
        return str(self.summary.get("federation") or self.folder.name)

    @property
    def rounds(self) -> list[RoundResult]:
        """The rounds finished, in order."""
        return self.result.rounds

    @property
    def central_accuracy(self) -> float | None:
        """The central baseline's accuracy (all data pooled), where the run measured it."""
        value = self.summary.get("centralized_accuracy")
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    @property
    def zones(self) -> list[dict[str, Any]]:
        """Each zone's own counters at the end of the run (summary.json), where known and well-formed."""
        zones = self.summary.get("zones")
        return [z for z in zones if _zone_entry(z) and "error" not in z] if isinstance(zones, list) else []

    @property
    def regions(self) -> dict[str, str]:
        """Zone → region: the zones' own word (summary.json), else the config the run ran with."""
        if self.zones:
            return {str(z.get("name")): str(z.get("region", "")) for z in self.zones}
        return dict(self.configured_regions)

    @property
    def jurisdictions(self) -> dict[str, str]:
        """Site id → jurisdiction."""
        return {s.site_id: s.jurisdiction for s in self.result.sites}


def load_run(folder: str | Path) -> RunRecord:
    """Read the run in ``folder`` (a ``fedshard simulate`` ``--out`` folder, or a deployed
    run's folder under the aggregator's state folder).

    Raises
    ------
    ConfigError
        ``folder`` holds no event log, or one that never assembled the federation, or a
        ``summary.json`` that is not JSON.
    """
    folder = Path(folder)
    events = folder / "events.jsonl"
    if not events.is_file():
        raise ConfigError(
            f"{folder} holds no run (no events.jsonl); give the folder of a `fedshard simulate` run "
            "(its --out) or of a deployed run (`fedshard aggregator up` prints it)"
        )
    skipped: list[str] = []
    try:
        result = replay(events, skipped)
    except FedshardError as exc:
        raise ConfigError(f"{folder}: nothing to report: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{events}: cannot be read ({exc.strerror or exc}); nothing was changed") from None
    skipped = [f"events.jsonl: {note}" for note in skipped]
    summary: dict[str, Any] = {}
    path = folder / "summary.json"
    if path.is_file():
        try:
            loaded = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not JSON ({exc}); move it away to report from the event log alone") from None
        summary = loaded if isinstance(loaded, dict) else {}
        zones = summary.get("zones")
        bad = [z for z in zones if not _zone_entry(z)] if isinstance(zones, list) else []
        skipped += [f"summary.json: a zone entry that is not one ({str(z)[:60]})" for z in bad]
    run = RunRecord(folder, result, summary, _configured_regions(folder / "federation.yaml"), skipped)
    _drop_unknown_zones(run)
    return run


class _ZoneEntry(TypedDict):
    """What the report reads of a zone's entry in ``summary.json``."""

    name: str
    region: NotRequired[str]
    reducing: NotRequired[bool]
    pushes: NotRequired[int]
    bytes_received: NotRequired[int]
    shards_by_class: NotRequired[dict[str, int]]
    forwarded_shards: NotRequired[int]
    forwarded_by_class: NotRequired[dict[str, int]]
    refused: NotRequired[int]
    refusals: NotRequired[list[str]]


_ZONE_ENTRY = TypeAdapter(_ZoneEntry)


def _zone_entry(entry: object) -> bool:
    """Whether ``entry`` is a zone entry the report can show (the types fedshard writes)."""
    if isinstance(entry, dict) and "error" in entry and isinstance(entry.get("name", ""), str):
        return True  # a zone that could not be asked: left out of the tables, not malformed
    try:
        _ZONE_ENTRY.validate_python(entry, strict=True)
    except ValidationError:
        return False
    return True


def _drop_unknown_zones(run: RunRecord) -> None:
    """Leave out the traffic a round reports for zones the run's config does not have (the
    coordinator refuses such replies; an older or edited log may still hold some)."""
    known = set(run.configured_regions) | {str(z.get("name")) for z in run.zones}
    if not known:
        return
    for i, r in enumerate(run.result.rounds):
        unknown = sorted(set(r.traffic) - known)
        if unknown:
            names = ", ".join(repr(z[:40]) for z in unknown[:3])
            run.skipped.append(f"round {r.round}: traffic for {len(unknown)} zone(s) not in the run's config ({names})")
            traffic = {z: t for z, t in r.traffic.items() if z in known}
            run.result.rounds[i] = replace(r, traffic=traffic)


def _configured_regions(path: Path) -> dict[str, str]:
    """Zone → region as the run's config lists them (empty when it cannot be read: the
    report then names zones without regions)."""
    try:
        config = yaml.safe_load(path.read_text())
        return {str(z["name"]): str(z["region"]) for z in config["zones"]}
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return {}
