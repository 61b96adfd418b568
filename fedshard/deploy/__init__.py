"""Deployment: provisioning a federation's keys, and running the aggregator and the sites
as separate processes on Flower's deployment engine (SuperLink, SuperNodes)."""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.deploy.aggregator_host import AggregatorHost
    from fedshard.deploy.keys import provision
    from fedshard.deploy.preflight import check_aggregator_config
    from fedshard.deploy.site import SiteNode, plan_site

__all__ = ["AggregatorHost", "SiteNode", "check_aggregator_config", "plan_site", "provision"]

__getattr__ = lazy_surface(
    __name__,
    {
        "AggregatorHost": "aggregator_host",
        "SiteNode": "site",
        "check_aggregator_config": "preflight",
        "plan_site": "site",
        "provision": "keys",
    },
)
