"""A site's routes: where each of its shards is pushed and which aggregate it applies.

Computed from the federation config by :class:`fedshard.routing.FederationRouting`
(the same decisions at every site, zone and ``fedshard route explain``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fedshard.residency import RouteDecision

__all__ = ["SiteRouting", "view_key"]


def view_key(zone: str, group: str) -> str:
    """``zone|group``: names one aggregate a site applies."""
    return f"{zone}|{group}"


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

    def view(self) -> dict[str, list[str]]:
        """``zone|group`` → the shards the site applies from that aggregate."""
        out: dict[str, list[str]] = {}
        for sid, d in self.routes.items():
            out.setdefault(view_key(*d.aggregate), []).append(sid)
        return dict(sorted(out.items()))
