"""Growing a running in-process federation: ``fedshard reconfigure RUN_DIR --config NEW``.

The command checks the new config against the run's (``RUN_DIR/federation.yaml``: only
zones added or drained, sites added, the number of rounds and ``min_sites`` may change;
:mod:`fedshard.config.changes`) and that every site still has a zone for every shard
and keeps its aggregates (:func:`fedshard.assembly.routing.check_regrouping`), then leaves it
in ``RUN_DIR/reconfigure.yaml``. The running ``fedshard simulate`` takes it before its
next round (:class:`RunMembership`): it starts the new zones' gRPC servers, gives every
zone the new membership (new sites' jurisdictions and signing keys, drained zones),
routes every site by the new config, assembles the new sites and hands the coordinator
the change (:mod:`fedshard.coordinator.membership`). The run's ``federation.yaml``
becomes the new config (a resumed run starts from it) and the request is kept as
``reconfigure.applied-<round>.yaml``; a request the run refuses after all is kept as
``reconfigure.refused-<round>.yaml`` with the reason in the log and the journal.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import yaml

from fedshard.assembly import ServedZones, grpc_connector, make_site
from fedshard.assembly.routing import FederationRouting, check_regrouping
from fedshard.config import FederationConfig
from fedshard.config.changes import ConfigChange
from fedshard.coordinator.events import EventLog
from fedshard.coordinator.membership import Reconfiguration, read_change
from fedshard.membership.offer import PENDING
from fedshard.protocol.channels import ZoneClient, ZoneConnector
from fedshard.site.site import Site

__all__ = ["RunMembership", "SiteJoin"]

log = logging.getLogger(__name__)


class SiteJoin(Protocol):
    """Where new sites join the run's control plane (the in-process engine's gateway)."""

    def add(self, sites: Mapping[str, Site]) -> None:
        """Make ``sites`` reachable by the coordinator's messages."""
        ...


class RunMembership:
    """The in-process engine's :class:`~fedshard.coordinator.membership.Membership`: the
    changes left in the run's folder, applied to its zones and sites.

    Parameters
    ----------
    config:
        The config the run has now.
    out:
        The run's folder.
    served:
        The run's zones (new ones are started here).
    routing:
        The routing the run's sites share (retargeted to the new config).
    gateway:
        The in-process gateway the new sites join.
    sites:
        The run's sites by id (the new ones are added).
    connect:
        How the sites reach the zones.
    signing_keys:
        Makes signing keys for new sites, their public keys by site id (the zones accept them).
    journal:
        The run's event log (a refused change is recorded there).
    """

    def __init__(
        self,
        config: FederationConfig,
        out: Path,
        served: ServedZones,
        routing: FederationRouting,
        gateway: SiteJoin,
        sites: dict[str, Site],
        connect: ZoneConnector,
        signing_keys: Callable[[FederationConfig, list[str]], Mapping[str, bytes]],
        journal: EventLog | None = None,
    ) -> None:
        self.config = config
        self.out = out
        self.served = served
        self.routing = routing
        self.gateway = gateway
        self.sites = sites
        self.connect = connect
        self.signing_keys = signing_keys
        self.journal = journal
        self._clients: dict[str, ZoneClient] = {}

    def before_round(self, rnd: int) -> Reconfiguration | None:
        """See :class:`~fedshard.coordinator.membership.Membership`."""
        pending = self.out / PENDING
        taken = read_change(pending, rnd, self.config, self.journal, self._check_regrouping)
        if taken is None:
            return None
        new, change = taken
        self._apply(new, change)
        (self.out / "federation.yaml").write_text(yaml.safe_dump(new.model_dump(mode="json"), sort_keys=False))
        os.replace(pending, self.out / f"reconfigure.applied-{rnd}.yaml")
        active = {z.name for z in new.zones if not z.drain}
        zones = {name: self._client(name) for name in sorted(active)}
        return Reconfiguration(new, zones, dict(self.served.endpoints), change.describe())

    def _check_regrouping(self, new: FederationConfig) -> None:
        check_regrouping(self.routing, FederationRouting(new, self.routing.classes))

    def _client(self, name: str) -> ZoneClient:
        if name not in self._clients:
            self._clients[name] = grpc_connector(name, self.served.endpoints[name])
        return self._clients[name]

    def _apply(self, new: FederationConfig, change: ConfigChange) -> None:
        """Zones first (they must know the new sites and zones before anything reaches them),
        then the routes every site pushes by, then the new sites."""
        keys = dict(self.served.site_keys or {})
        keys.update(self.signing_keys(new, list(change.added_sites)))
        self.served.site_keys = keys
        self.routing.retarget(new)
        for zone in new.zones:
            if zone.name in change.added_zones:
                log.info("zone %s (%s) starts at %s", zone.name, zone.region, self.served.add(zone))
        for name, aggregator in self.served.zones.items():
            aggregator.reconfigure(self.routing.zone_policy(name, keys), by="coordinator")
        for site in self.sites.values():
            site.reroute()
        root = self.out / "sites"
        where = self.served.endpoints
        joining = {
            sid: make_site(new, sid, root, self.routing, connect=self.connect, endpoints=where)
            for sid in change.added_sites
        }
        self.sites.update(joining)
        self.gateway.add(joining)
        self.config = new

    def close(self) -> None:
        """Close the coordinator's clients of the zones added during the run."""
        for client in self._clients.values():
            client.close()
