"""Growing a deployed federation: the change requested, and the deployed run's
:class:`~fedshard.coordinator.membership.Membership` that takes it.

``fedshard aggregator reconfigure --config NEW`` checks the new config (the same file
``aggregator up`` takes, with the new zones and sites) against the running federation's, as
the aggregator runs it (:func:`effective_config`: zone stores in the run folder, absolute
paths), and leaves it in the run folder (:data:`~fedshard.membership.offer.PENDING`,
:func:`request_deployed_change`). The running ``aggregator up``
(:meth:`AggregatorHost.take_change
<fedshard.deploy.aggregator_host.AggregatorHost.take_change>`) checks the keys of the new
parties, makes it the run's ``federation.yaml``, starts the new zones it hosts, registers
the new sites' SuperNode keys, then renames it :data:`READY`. Before its next round the
coordinator (the ServerApp) asks every zone, drained ones too (they still serve what they
published), to take the membership it reads from its own config file (the ``Reconfigure``
call; see :mod:`fedshard.membership.zone_reload`), and only when every zone has, takes the
config itself. A zone that cannot take it yet (down, restarting, its host's file not
updated) leaves the change ready: it is tried again before each round, with a warning once.
The zones that took it meanwhile hold a membership the running one is part of (more sites
and zones, the same policy and aggregates), and the coordinator opens rounds for the old one
only: nothing is accepted that the old membership would refuse, except Info calls and
fetches of published aggregates by the sites still waiting to join.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from fedshard.config import FederationConfig, ZoneConfig
from fedshard.config.changes import ConfigChange, membership_digest
from fedshard.coordinator.events import EventLog
from fedshard.coordinator.membership import Reconfiguration, read_change
from fedshard.crypto.identity import ZoneId
from fedshard.crypto.tls import TlsFiles
from fedshard.errors import FedshardError
from fedshard.membership.offer import offer_change
from fedshard.protocol.channels import ZoneClient
from fedshard.zone.rpc.client import GrpcZoneClient

__all__ = ["READY", "FolderMembership", "effective_config", "request_deployed_change"]

log = logging.getLogger(__name__)

READY = "reconfigure.ready.yaml"
"""A change the aggregator host prepared (new zones up, new sites registered), in the run folder."""


class FolderMembership:
    """Changes left in ``run_dir`` as :data:`READY`, taken before a round.

    Parameters
    ----------
    config:
        The config the run has now.
    run_dir:
        The run's folder (``federation.yaml``, ``events.jsonl``).
    zones:
        The coordinator's zone clients so far (reused; new ones are made with ``tls``).
    tls:
        The coordinator's certificate for the zones (None: plain text).
    journal:
        The run's event log (a refused change is recorded there).
    """

    def __init__(
        self,
        config: FederationConfig,
        run_dir: Path,
        zones: Mapping[str, ZoneClient],
        tls: TlsFiles | None,
        journal: EventLog | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.tls = tls
        self.journal = journal
        self._clients: dict[str, ZoneClient] = dict(zones)
        self._made: list[ZoneClient] = []
        self._waiting: tuple[int, str] | None = None  # the ready file and reason last warned about

    def before_round(self, rnd: int) -> Reconfiguration | None:
        """See :class:`~fedshard.coordinator.membership.Membership`."""
        ready = self.run_dir / READY
        taken = read_change(ready, rnd, self.config, self.journal)
        if taken is None:
            return None
        new, change = taken
        digest = membership_digest(new)
        for zone in new.zones:  # the coordinator takes it once every zone has (taking it again is harmless)
            try:
                with GrpcZoneClient(zone.endpoint, timeout=30.0, tls=self.tls, zone=_zone_id(zone)) as client:
                    client.reconfigure(digest)
            except FedshardError as exc:
                self._wait(rnd, ready, f"zone {zone.name} did not take it: {exc}")
                return None
        os.replace(ready, self.run_dir / f"reconfigure.applied-{rnd}.yaml")
        self.config = new
        zones = {z.name: self._client(z) for z in new.zones if not z.drain}
        return Reconfiguration(new, zones, {z.name: z.endpoint for z in new.zones}, change.describe())

    def _wait(self, rnd: int, ready: Path, reason: str) -> None:
        """Warn, once per prepared change and reason, that it waits for another round."""
        key = (ready.stat().st_mtime_ns, reason)
        if self._waiting != key:
            log.warning("before round %d: the prepared change waits (tried again before each round): %s", rnd, reason)
            self._waiting = key

    def _client(self, zone: ZoneConfig) -> ZoneClient:
        if zone.name not in self._clients:
            client = GrpcZoneClient(zone.endpoint, tls=self.tls, zone=_zone_id(zone))
            self._clients[zone.name] = client
            self._made.append(client)
        return self._clients[zone.name]

    def close(self) -> None:
        """Close the zone clients made for zones added during the run."""
        for client in self._made:
            client.close()


def _zone_id(zone: ZoneConfig) -> ZoneId:
    """The zone a coordinator's client checks it reaches (with mutual TLS)."""
    return ZoneId(zone.name, zone.region)


def effective_config(config: FederationConfig, run_dir: Path, he_keys: Path | None) -> FederationConfig:
    """``config`` as the zones and the ServerApp of the run in ``run_dir`` use it: every zone's
    store under ``run_dir/zones/``, the public HE context in ``he_keys`` (when encrypting)."""
    he = config.he
    if config.residency.encrypting and he_keys is not None:
        he = he.model_copy(update={"keys": he_keys.resolve()})
    zones = [z.model_copy(update={"store": (run_dir / "zones" / z.name).resolve()}) for z in config.zones]
    return config.model_copy(update={"he": he, "zones": zones})


def request_deployed_change(config: FederationConfig, run_dir: Path, he_keys: Path | None) -> ConfigChange:
    """Check ``config`` against the deployed run in ``run_dir`` and leave it for its aggregator
    (``he_keys``: where the zones' public HE context is, as for :func:`effective_config`).

    Raises
    ------
    ConfigError
        The change is one a running federation may not take, or routes a site's shards
        nowhere or to other aggregates. Nothing is written then.
    """
    return offer_change(run_dir, effective_config(config, run_dir, he_keys))
