"""What a zone has done for its run: counters for run summaries (``fedshard zone``
details, ``summary.json``) and for its Prometheus metrics (:mod:`fedshard.observability.zone_metrics`).

Every figure here is the zone's own: what it accepted, refused, forwarded and served,
and how long it took to fold pushes and close rounds. A zone with a store saves its
counters there at every round it closes (:meth:`ZoneStats.save`) and takes them up again
when it starts on that store. A resumed run's summary therefore counts the whole run,
not only what came after the resume. The durations are this process's only.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedshard.errors import RefusalCode
from fedshard.integrity import Manifest

if TYPE_CHECKING:
    from prometheus_client import Histogram

__all__ = ["DURATION_BUCKETS", "ZoneStats"]

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Histogram buckets (seconds) of fold and close times: a millisecond (a small model's
push) to minutes (a large model's round at a busy zone)."""

UNCLASSIFIED = "unclassified"
"""The class of a shard whose manifest names none (zones without a residency policy)."""


def _histogram(name: str, doc: str) -> Histogram:
    """A zone's own duration histogram (not in any registry: :mod:`fedshard.observability.zone_metrics` exports it).
    prometheus-client is imported here, by a zone, never by a site's process importing this module."""
    from prometheus_client import Histogram

    return Histogram(name, doc, registry=None, buckets=DURATION_BUCKETS)


@dataclass
class ZoneStats:
    """What a zone has done since it started."""

    pushes: int = 0
    refused: int = 0
    bytes_received: int = 0
    shards: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # (class, origin)
    forwarded_shards: int = 0
    forwarded_bytes: int = 0
    forwarded: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # (class, origin)
    partials_received: int = 0
    served: int = 0  # aggregates served to sites
    refusals: list[str] = field(default_factory=list)  # the latest reasons (at most 20)
    refusal_codes: collections.Counter[str] = field(default_factory=collections.Counter)  # code -> refusals
    round: int = 0  # the latest round opened
    rounds_closed: int = 0
    fold_seconds: Histogram = field(
        default_factory=lambda: _histogram("fedshard_zone_fold_seconds", "Seconds folding one push into the sums")
    )
    close_seconds: Histogram = field(
        default_factory=lambda: _histogram("fedshard_zone_close_seconds", "Seconds closing one round")
    )

    def count_push(self, manifest: Manifest, origin: str | None, fold_s: float) -> None:
        """Count an accepted push; ``origin`` is the pushing site's jurisdiction, where known;
        ``fold_s`` the seconds folding it took."""
        self.pushes += 1
        self.bytes_received += manifest.total_bytes
        self.shards.update((e.shard_class or UNCLASSIFIED, origin or "") for e in manifest.shards)
        self.fold_seconds.observe(fold_s)

    def count_forward(
        self, entries: Iterable[tuple[str, Iterable[str]]], classes: Mapping[str, str], origins: Mapping[str, str]
    ) -> None:
        """Count the sites' shards whose values left this zone inside partial sums: ``entries``
        are (shard id, its contributors), ``classes`` shard id → class, ``origins`` site id →
        jurisdiction (what the report says left each region, by class and origin)."""
        for shard_id, contributors in entries:
            shard_class = classes.get(shard_id) or UNCLASSIFIED
            self.forwarded.update((shard_class, origins.get(site, "")) for site in contributors)

    def refuse(self, reason: str, code: RefusalCode | None) -> None:
        """Count a refusal (by its code) and remember its reason."""
        self.refused += 1
        self.refusal_codes[code.value if code is not None else "other"] += 1
        self.refusals = [*self.refusals[-19:], reason]

    def closed(self, seconds: float) -> None:
        """Count a round closed (published) in ``seconds``."""
        self.rounds_closed += 1
        self.close_seconds.observe(seconds)

    @property
    def shards_by_class(self) -> dict[str, int]:
        """Shards received by class and origin, ``{"personal from EU": 200, ...}``."""
        return _named(self.shards)

    @property
    def forwarded_by_class(self) -> dict[str, int]:
        """Sites' shards forwarded inside partial sums, by class and origin (as :attr:`shards_by_class`)."""
        return _named(self.forwarded)

    _SAVED = (
        "pushes",
        "refused",
        "bytes_received",
        "forwarded_shards",
        "forwarded_bytes",
        "partials_received",
        "served",
        "round",
        "rounds_closed",
    )

    def save(self, path: Path) -> None:
        """Write the counters to ``path`` (atomically: a crash leaves the previous ones)."""
        data: dict[str, Any] = {key: getattr(self, key) for key in self._SAVED}
        data["shards"] = [[c, o, n] for (c, o), n in sorted(self.shards.items())]
        data["forwarded"] = [[c, o, n] for (c, o), n in sorted(self.forwarded.items())]
        data["refusal_codes"] = dict(self.refusal_codes)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    def load(self, path: Path) -> None:
        """Take up the counters saved at ``path`` (none there, or unreadable: start from zero;
        they are a record, never an input to aggregation)."""
        try:
            data = json.loads(path.read_text())
            counters = {key: int(data[key]) for key in self._SAVED}
            shards = collections.Counter({(str(c), str(o)): int(n) for c, o, n in data["shards"]})
            forwarded = collections.Counter({(str(c), str(o)): int(n) for c, o, n in data.get("forwarded", [])})
            codes = collections.Counter({str(k): int(v) for k, v in data["refusal_codes"].items()})
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return
        for key, value in counters.items():
            setattr(self, key, value)
        self.shards, self.forwarded, self.refusal_codes = shards, forwarded, codes

    def as_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "pushes": self.pushes,
            "refused": self.refused,
            "refusal_codes": dict(sorted(self.refusal_codes.items())),
            "bytes_received": self.bytes_received,
            "shards_by_class": self.shards_by_class,
            "forwarded_shards": self.forwarded_shards,
            "forwarded_by_class": self.forwarded_by_class,
            "forwarded_bytes": self.forwarded_bytes,
            "partials_received": self.partials_received,
            "served": self.served,
            "refusals": list(self.refusals),
            "round": self.round,
            "rounds_closed": self.rounds_closed,
        }


def _named(counts: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """``{(class, origin): n}`` as ``{"class from origin": n}`` (just the class where the origin is unknown)."""
    return dict(sorted((f"{c} from {o}" if o else c, n) for (c, o), n in counts.items()))
