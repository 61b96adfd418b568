"""What a run folder says about its run, as the report reads it: the event log (every
run has one, finished or not), and ``summary.json`` where the run wrote it (the zones'
own counters, the central baseline)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

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
        """Each zone's own counters at the end of the run (summary.json), where known."""
        zones = self.summary.get("zones")
        return [z for z in zones if isinstance(z, dict) and "error" not in z] if isinstance(zones, list) else []

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

    @property
    def has_privacy(self) -> bool:
        """Whether any site reported a privacy ledger."""
        return bool(self.result.privacy)


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
    try:
        result = replay(events)
    except FedshardError as exc:
        raise ConfigError(f"{folder}: nothing to report: {exc}") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{events}: not an event log fedshard wrote ({exc}); nothing was changed") from None
    summary: dict[str, Any] = {}
    path = folder / "summary.json"
    if path.is_file():
        try:
            loaded = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not JSON ({exc}); move it away to report from the event log alone") from None
        summary = loaded if isinstance(loaded, dict) else {}
    return RunRecord(folder, result, summary, _configured_regions(folder / "federation.yaml"))


def _configured_regions(path: Path) -> dict[str, str]:
    """Zone → region as the run's config lists them (empty when it cannot be read: the
    report then names zones without regions)."""
    try:
        config = yaml.safe_load(path.read_text())
        return {str(z["name"]): str(z["region"]) for z in config["zones"]}
    except (OSError, yaml.YAMLError, TypeError, KeyError):
        return {}
