"""Where one round's time went and what it moved, as the coordinator logs it with the round.

The coordinator times what it waits for (opening the round at every zone, the sites'
train replies, each zone's close, the sites' evaluate replies); each site reports its
own phases (:class:`~fedshard.protocol.timings.PhaseTimes`) and relays what each zone
acknowledged of its push (bytes, shards by class, the zone's fold time). The report
(``fedshard report``) and the aggregator's metrics read them from the event log.
"""

from __future__ import annotations

import collections
import time
from contextlib import AbstractContextManager
from typing import Any

from fedshard.protocol.messages import EvaluateReport, TrainReport
from fedshard.protocol.timings import Phase, Stopwatch

__all__ = ["RoundClock"]


class RoundClock:
    """One round's timings and traffic, as they come in."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._waits = Stopwatch()  # the coordinator's own: open, train, close, evaluate
        self._close = Stopwatch()  # zone -> seconds its close took
        self._fold: collections.defaultdict[str, float] = collections.defaultdict(float)  # zone -> fold seconds
        self._sites: dict[str, collections.defaultdict[str, float]] = {}  # site -> phase -> seconds
        self._bytes: collections.Counter[str] = collections.Counter()  # zone -> bytes received
        self._shards: dict[str, collections.Counter[str]] = {}  # zone -> "personal from EU" -> shards
        self._ended: float | None = None  # set once the round's time stops (its evaluation is carried on)

    def stop(self) -> None:
        """End the round's time now: its evaluation comes with the next round's train messages, whose
        time is that round's."""
        if self._ended is None:
            self._ended = time.perf_counter()

    def waiting(self, phase: Phase) -> AbstractContextManager[None]:
        """Time what the coordinator waits for in ``phase``."""
        return self._waits.phase(phase)

    def closing(self, zone: str) -> AbstractContextManager[None]:
        """Time ``zone``'s close (part of the close phase)."""
        return self._close.phase(zone)

    def trained(self, site_id: str, report: TrainReport, jurisdiction: str) -> None:
        """``site_id``'s train reply (checked: :mod:`fedshard.coordinator._replies`): its phases;
        for a push it made, what each zone acknowledged."""
        phases = self._site(site_id, report.timings.as_dict())
        if not report.ok:
            return
        for push in report.pushes:
            phases[Phase.FOLD] = max(phases[Phase.FOLD], push.fold_s)  # the zones fold in parallel
            self._fold[push.zone] += push.fold_s
            self._bytes[push.zone] += push.nbytes
            by_class = self._shards.setdefault(push.zone, collections.Counter())
            by_class.update({f"{c} from {jurisdiction}": n for c, n in push.classes.items()})

    def evaluated(self, site_id: str, report: EvaluateReport) -> None:
        """``site_id``'s evaluation (its evaluate reply, or carried by its next train reply): its
        phases (fetch and apply add to those of its train reply)."""
        self._site(site_id, report.timings.as_dict())

    def _site(self, site_id: str, seconds: dict[str, float]) -> collections.defaultdict[str, float]:
        phases = self._sites.setdefault(site_id, collections.defaultdict(float))
        for phase, s in seconds.items():
            phases[phase] += s
        return phases

    def timings(self) -> dict[str, Any]:
        """What :attr:`~fedshard.coordinator.results.RoundResult.timings` holds: the round's
        seconds (``round``), the coordinator's waits by phase (``coordinator``), each zone's
        ``close`` and ``fold`` seconds (``zones``), each site's seconds by phase (``sites``)."""
        closed = self._close.seconds
        zones = sorted(set(closed) | set(self._fold))
        return {
            "round": _ms((self._ended or time.perf_counter()) - self._started),
            "coordinator": {phase: _ms(s) for phase, s in self._waits.seconds.items()},
            "zones": {z: {"close": _ms(closed.get(z, 0.0)), "fold": _ms(self._fold[z])} for z in zones},
            "sites": {site: {p: _ms(s) for p, s in sorted(ph.items())} for site, ph in sorted(self._sites.items())},
        }

    def traffic(self) -> dict[str, Any]:
        """What :attr:`~fedshard.coordinator.results.RoundResult.traffic` holds: by zone, the
        bytes and the shards by class and origin its acknowledgements counted this round."""
        return {
            zone: {"bytes": self._bytes[zone], "shards": dict(sorted(self._shards.get(zone, {}).items()))}
            for zone in sorted(self._bytes)
        }


def _ms(seconds: float) -> float:
    return round(seconds, 4)
