"""Hot/cold tiering: ages, what a tiering pass did, and per-tier statistics.

A shard whose last access (read or write) is older than a given age moves to the cold
tier in a low-precision format (:mod:`fedshard.store.quantize`); reads dequantise it
transparently; writing it again brings it back to the hot tier at full precision. The
move itself is :meth:`fedshard.store.sealed_store.SealedShardStore.tier`; this module
holds the pure parts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fedshard.errors import ConfigError
from fedshard.store.catalog import CatalogEntry
from fedshard.store.quantize import BOUND_TEXT, ColdFormat

__all__ = ["FormatError", "StoreStats", "TierReport", "TierUsage", "parse_age", "store_stats"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_age(text: str) -> float:
    """Seconds in an age such as ``90d``, ``12h``, ``30m``, ``45s`` or ``2w``.

    Raises
    ------
    ConfigError
        Not a number followed by one of s, m, h, d, w.
    """
    match = _AGE_RE.match(text)
    if not match:
        raise ConfigError(f"age {text!r} is not valid: use a number and a unit s, m, h, d or w (e.g. 90d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True, slots=True)
class TierReport:
    """What one tiering pass did."""

    format: str
    moved: list[str]
    skipped: list[str]  # cold by age but kept hot: not finite floating point values
    damaged: list[str]  # cold by age but failing their read checks: left as they are
    bytes_before: int  # stored bytes of the moved shards before
    bytes_after: int  # and after

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for JSON)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TierUsage:
    """Shards and bytes of one tier."""

    shards: int = 0
    stored_bytes: int = 0  # blob bytes on the backend
    logical_bytes: int = 0  # bytes of the same shards at full precision


@dataclass(frozen=True, slots=True)
class FormatError:
    """Measured quantisation error of the cold shards of one format (when they were tiered)."""

    shards: int
    values: int
    max_abs: float
    rms: float
    relative_rms: float  # rms error / rms of the original values
    bound: str


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Shards and bytes per tier, and the measured quantisation error per cold format."""

    tiers: dict[str, TierUsage]
    formats: dict[str, FormatError] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        return {
            "tiers": {name: asdict(usage) for name, usage in self.tiers.items()},
            "formats": {name: asdict(err) for name, err in self.formats.items()},
        }


def store_stats(entries: Iterable[CatalogEntry]) -> StoreStats:
    """Aggregate catalog entries into :class:`StoreStats`."""
    tiers: dict[str, list[int]] = {"hot": [0, 0, 0], "cold": [0, 0, 0]}
    errs: dict[str, list[float]] = {}
    for e in entries:
        t = tiers["cold" if e.cold else "hot"]
        t[0] += 1
        t[1] += e.stored_bytes
        t[2] += e.logical_bytes
        if e.cold:
            acc = errs.setdefault(e.encoding, [0, 0, 0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += e.values
            acc[2] = max(acc[2], e.err_max)
            acc[3] += e.err_sq
            acc[4] += e.ref_sq
    formats = {}
    for name, (shards, values, max_abs, err_sq, ref_sq) in sorted(errs.items()):
        rms = math.sqrt(err_sq / values) if values else 0.0
        ref = math.sqrt(ref_sq / values) if values else 0.0
        formats[name] = FormatError(
            shards=int(shards),
            values=int(values),
            max_abs=max_abs,
            rms=rms,
            relative_rms=rms / ref if ref > 0 else 0.0,
            bound=BOUND_TEXT[ColdFormat(name)],
        )
    usage = {name: TierUsage(*vals) for name, vals in tiers.items()}
    return StoreStats(usage, formats)
