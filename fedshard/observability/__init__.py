"""Observability: what a running federation exports to Prometheus, in one place.

``server``        the metrics HTTP endpoint (``--metrics-port``): bounded connections, loopback by
                  default, the last values kept in the run folder when a run ends
``run_metrics``   a run's series, read from its event log at every scrape
``zone_metrics``  a zone's series, read from its counters at every scrape
``host``          an aggregator host's ports: the run's series, and one port per zone it starts

Nothing here decides anything: every series is read from records the roles keep
(the event log, a zone's counters), so what is scraped is what was logged.
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.observability.host import HostMetrics
    from fedshard.observability.run_metrics import RunCollector
    from fedshard.observability.server import MetricsServer
    from fedshard.observability.zone_metrics import ZoneCollector

__all__ = ["HostMetrics", "MetricsServer", "RunCollector", "ZoneCollector"]

__getattr__ = lazy_surface(
    __name__,
    {"HostMetrics": "host", "MetricsServer": "server", "RunCollector": "run_metrics", "ZoneCollector": "zone_metrics"},
)
