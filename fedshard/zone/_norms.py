"""A zone's reference for update norms: what an honest site's update at this zone looks like.

A zone sees only its own shards of each site's update, and sites whose routes differ
push different shards to it, so updates are compared with those of the sites that push
the *same shards* here (:func:`shard_set`). When a round closes, the zone keeps, per
shard set, the L2 norms it accepted (after clipping) in its last :data:`REFERENCE_ROUNDS`
rounds with such pushes; the next round bounds each push by
``aggregation.max_norm_over_median`` times their lower median
(:meth:`NormReference.bound`), as well as by ``aggregation.max_update_norm`` when set.
Honest updates' norms vary from round to round (up to ~8× the lower median of the three
rounds before, in the demo), hence a window of rounds and a factor of 10 by default.

A round that opened with no reference for a shard set (the zone's first round after it
started, or a route new to it) was folded unbounded; when it closes, the zone compares
each of its norms with the factor times that round's own lower median
(:meth:`NormReference.closed`) and, if one is above, refuses to publish the round (code
``bound``: the coordinator aborts it and runs the next) and keeps the norms, the outlier
clipped, as its reference. So one lying site costs the federation at most one aborted
round per zone start, never a poisoned aggregate.

What the bound does and does not promise (see SECURITY.md, "Malicious sites"):

* the lower median of ``n`` norms is one of the ``⌈n/2⌉`` smallest, so norms that are
  fewer than half of the window's cannot raise the next round's bound (and an over-sized
  update is clipped before it is counted, so the reference grows by at most the factor
  per round even then);
* a shard set that only one site pushes to a zone is compared with that site's own
  earlier rounds only: its norm grows at most ×factor per round, from whatever it was in
  its first round;
* encrypted (HE) shards cannot be measured and are not part of the norm.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from fedshard.config import AggregationConfig
from fedshard.integrity import Manifest

__all__ = ["REFERENCE_ROUNDS", "NormReference", "Outlier", "shard_set"]

REFERENCE_ROUNDS = 3
"""Rounds (with pushes of a shard set) whose accepted norms make that shard set's reference."""


def shard_set(manifest: Manifest) -> str:
    """Which plaintext shards a push holds, as a short key (sites of one residency route share it)."""
    ids = sorted(e.shard_id for e in manifest.shards if not e.encrypted)
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Outlier:
    """A push of a round without a reference whose norm exceeds the factor times the round's median."""

    site: str
    norm: float
    bound: float

    def describe(self) -> str:
        """One line naming the site, e.g. ``site s2's update norm 194 is above 13.6
        (max_norm_over_median × the round's median)``."""
        return (
            f"site {self.site}'s update norm {self.norm:.4g} is above {self.bound:.4g} "
            "(aggregation.max_norm_over_median × the median of the round's norms)"
        )


class NormReference:
    """Per shard set, the update norms a zone accepted in its last :data:`REFERENCE_ROUNDS`
    rounds with pushes of it; their lower median is what later pushes are bounded by."""

    def __init__(self, bounds: AggregationConfig) -> None:
        self._bounds = bounds
        self._rounds: dict[str, deque[tuple[int, list[float]]]] = {}  # shard set -> (round, norms)

    def snapshot(self) -> dict[str, float]:
        """Shard set → the median norm a round that opens now bounds its pushes by."""
        out = {}
        for key, rounds in self._rounds.items():
            pooled = sorted(n for _, norms in rounds for n in norms)
            if pooled:
                out[key] = float(statistics.median_low(pooled))
        return out

    def bound(self, reference: Mapping[str, float], key: str) -> float | None:
        """The L2 bound of a push of shard set ``key`` in a round opened with ``reference``
        (None: unbounded)."""
        limits = [self._bounds.max_update_norm]
        factor, median = self._bounds.max_norm_over_median, reference.get(key)
        if factor is not None and median is not None and median > 0:
            limits.append(factor * median)
        present = [limit for limit in limits if limit is not None]
        return min(present) if present else None

    def closed(
        self, rnd: int, norms: Mapping[str, Mapping[str, float]], reference: Mapping[str, float]
    ) -> list[Outlier]:
        """Round ``rnd``, opened with ``reference``, closes having accepted ``norms`` (shard set →
        site → norm after clipping): keep them; the pushes of shard sets the round had no
        reference for whose norm exceeds the factor times the round's lower median (kept
        clipped to it). Closing the same round again replaces what it kept."""
        factor = self._bounds.max_norm_over_median
        outliers: list[Outlier] = []
        for key, by_site in norms.items():
            kept = dict(by_site)
            if key not in reference and factor is not None and len(kept) > 1:
                limit = factor * statistics.median_low(sorted(kept.values()))
                for site, norm in sorted(kept.items()):
                    if limit > 0 and norm > limit:
                        outliers.append(Outlier(site, norm, limit))
                        kept[site] = limit
            if kept:
                window = self._rounds.setdefault(key, deque(maxlen=REFERENCE_ROUNDS))
                if window and window[-1][0] == rnd:
                    window.pop()
                window.append((rnd, list(kept.values())))
        return outliers
