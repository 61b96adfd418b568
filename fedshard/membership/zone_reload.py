"""A served zone's membership, re-read from the files it was started with.

``fedshard zone up --config FILE [--site-keys DIR]`` keeps a :class:`ZoneReload`: when
the coordinator asks, between rounds, that the zone take a new membership (the
``Reconfigure`` call, coordinator certificate only), the zone reads its own config
file and site-key folder again. The coordinator decides *when*; what the zone enforces
still comes from its host's files: the request carries only the digest of the
membership the coordinator runs with (:func:`~fedshard.config.changes.membership_digest`),
and the zone refuses when its file says otherwise, when the change is one a running
federation may not take (:func:`~fedshard.config.changes.check_change`), when it would
move a site of the run to other aggregates (:func:`~fedshard.assembly.routing.check_regrouping`)
or while a round is open.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fedshard.assembly.routing import FederationRouting, check_regrouping
from fedshard.assembly.sites import load_site_keys
from fedshard.config import FederationConfig, load_federation
from fedshard.config.changes import check_change, membership_digest
from fedshard.errors import ConfigError
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.policy import ZonePolicy

__all__ = ["ZoneReload"]

log = logging.getLogger(__name__)


class ZoneReload:
    """Gives ``zone`` the membership in ``config_path`` (and ``site_keys``) on request.

    Parameters
    ----------
    zone:
        The served zone.
    config_path:
        The federation config file the zone was started from (read again on each request).
    routing:
        The routing of the config the zone runs with now.
    site_keys:
        The folder of sites' manifest-signing keys the zone was started with (None: it
        checks no signatures, as when it started).
    """

    def __init__(
        self, zone: ZoneAggregator, config_path: Path, routing: FederationRouting, site_keys: Path | None = None
    ) -> None:
        self.zone = zone
        self.config_path = config_path
        self.routing = routing
        self.site_keys = site_keys

    @property
    def config(self) -> FederationConfig:
        """The config the zone runs with."""
        return self.routing.config

    def __call__(self, digest: str, by: str) -> ZonePolicy:
        """Read the files again, check them and give the zone the new membership; its policy.

        Raises
        ------
        ConfigError
            The file's membership is not ``digest``, or the change is one a running
            federation may not take.
        ZoneError
            A round is open at the zone.
        """
        new = load_federation(self.config_path)
        mine = membership_digest(new)
        if mine != digest:
            raise ConfigError(
                f"zone {self.zone.name}: {self.config_path} lists other parties ({mine[:12]}…) than the "
                f"coordinator ({digest[:12]}…); give this zone's host the federation's new config first"
            )
        check_change(self.config, new)
        routing = FederationRouting(new, self.routing.classes)
        check_regrouping(self.routing, routing)
        keys = load_site_keys(self.site_keys) if self.site_keys is not None else None
        policy = routing.zone_policy(self.zone.name, keys)
        self.zone.reconfigure(policy, by=by)
        self.routing = routing
        return policy
