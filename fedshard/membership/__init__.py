"""Growing a running federation between rounds (hot-plug): zones added or drained, sites
joining, more rounds. Every part of it lives here but for the two it rests on:
:mod:`fedshard.config.changes` (what a running federation may change, and the digest of a
membership) and :mod:`fedshard.coordinator.membership` (the :class:`Membership` port the
coordinator asks before each round, and how it admits the sites that joined).

``offer``        a new config checked against the run's and left in its folder (``reconfigure.yaml``)
``in_process``   the in-process engine takes it: new zones started, every zone told, new sites built
``deployed``     a deployment: the aggregator's request, and the run's membership that hands the
                 change to every zone before the coordinator takes it
``zone_reload``  a served zone re-reads its own config and site keys when the coordinator asks

A change flows: ``fedshard reconfigure`` / ``fedshard aggregator reconfigure`` →
:func:`~fedshard.membership.offer.offer_change` → (deployed: the aggregator host starts new
zones, registers new SuperNodes, marks it ready) → before the next round the run's
membership applies it → the coordinator takes the new config and admits the new sites.
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.membership.deployed import FolderMembership, request_deployed_change
    from fedshard.membership.in_process import RunMembership
    from fedshard.membership.offer import offer_change, request_change
    from fedshard.membership.zone_reload import ZoneReload

__all__ = [
    "FolderMembership",
    "RunMembership",
    "ZoneReload",
    "offer_change",
    "request_change",
    "request_deployed_change",
]

__getattr__ = lazy_surface(
    __name__,
    {
        "FolderMembership": "deployed",
        "RunMembership": "in_process",
        "ZoneReload": "zone_reload",
        "offer_change": "offer",
        "request_change": "offer",
        "request_deployed_change": "deployed",
    },
)
