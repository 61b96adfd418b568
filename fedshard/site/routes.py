"""A site's routes: where each of its shards is pushed and which aggregate it applies.

Computed from the federation config by :class:`fedshard.assembly.routing.FederationRouting`
(the same decisions at every site, zone and ``fedshard route explain``). Classifying
the shards needs the model; a site keeps the classification of its model in its
state folder (:func:`read_classes`, :func:`write_classes`), keyed by the shard plan
and the residency config, so a fresh process answers a query without building it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedshard.residency import AggregateKey, Classification, RouteDecision

if TYPE_CHECKING:
    import torch

    from fedshard.sharding import ShardPlan

__all__ = ["CLASSES_FILE", "RouteSource", "SiteRouting", "read_classes", "single_zone_routing", "write_classes"]

CLASSES_FILE = "classes.json"
"""In a site's state folder: the classification of its model's shards."""
_CLASSES_FORMAT = 1

ModelSource = Callable[[], "tuple[ShardPlan, torch.nn.Module]"]
"""The site's shard plan and model (built on first call)."""


@dataclass(frozen=True)
class SiteRouting:
    """One site's routes: where each shard is pushed and which aggregate it applies.

    Attributes
    ----------
    routes:
        Shard id → route decision, in plan order.
    policy_digest:
        Digest of the policy the routes follow (carried in every manifest).
    """

    routes: Mapping[str, RouteDecision]

    policy_digest: str

    encrypted: frozenset[str] = frozenset()

    @property
    def classes(self) -> dict[str, str]:
        """Shard id → class."""
        return {sid: d.shard_class for sid, d in self.routes.items()}

    def by_zone(self) -> dict[str, list[str]]:
        """Zone → the shards pushed to it (zones sorted by name)."""
        out: dict[str, list[str]] = {}
        for sid, d in self.routes.items():
            out.setdefault(d.zone, []).append(sid)
        return dict(sorted(out.items()))

    def view(self) -> dict[AggregateKey, list[str]]:
        """Aggregate → the shards the site applies from it (aggregates sorted by zone, then group)."""
        out: dict[AggregateKey, list[str]] = {}
        for sid, d in self.routes.items():
            out.setdefault(d.aggregate, []).append(sid)
        return dict(sorted(out.items()))


RouteSource = Callable[[str, ModelSource], SiteRouting]
"""A site's routes from its plan digest and its model (asked for only when the shards must be classified)."""


def single_zone_routing(site_id: str, zones: Mapping[str, str], shard_ids: Sequence[str]) -> SiteRouting:
    """Without residency routing: every shard to the first of ``zones`` (by name), one default group."""
    from fedshard.errors import RoundError
    from fedshard.protocol.rounds import DEFAULT_GROUP

    if not zones:
        raise RoundError(f"site {site_id}: the round names no zone to push to")
    zone = sorted(zones)[0]
    routes = {
        sid: RouteDecision(sid, "", "no residency routing", "", ["*"], zone, group=DEFAULT_GROUP) for sid in shard_ids
    }
    return SiteRouting(routes, "")


def read_classes(path: Path, key: str) -> dict[str, Classification] | None:
    """The classification saved in ``path`` under ``key``; None when absent, unreadable or for another key."""
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != _CLASSES_FORMAT or doc.get("key") != key:
            return None
        return {sid: Classification(str(c), str(r)) for sid, (c, r) in doc["classes"].items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def write_classes(path: Path, key: str, classes: Mapping[str, Classification]) -> None:
    """Save ``classes`` under ``key`` in ``path`` (temporary file, then rename)."""
    doc = {
        "format": _CLASSES_FORMAT,
        "key": key,
        "classes": {sid: [c.shard_class, c.reason] for sid, c in classes.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
