"""A zone's Prometheus metrics, read from its counters at every scrape (see README,
"Metrics"): what it received, by class and origin, what it refused, by code, how long
folding pushes and closing rounds took. One collector exports any number of zones (a
simulation runs them all in one process), each series labelled with its ``zone``.

The series hold what the zone itself counted; nothing a site reports reaches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from fedshard.zone.aggregator import ZoneAggregator

__all__ = ["ZONE_METRICS", "ZoneCollector"]

ZONE_METRICS: dict[str, str] = {
    "fedshard_zone_info": "The zone: its region and whether it is the reducing zone (always 1)",
    "fedshard_zone_round": "The latest round opened at the zone",
    "fedshard_zone_open_rounds": "Rounds open at the zone now",
    "fedshard_zone_rounds_closed_total": "Rounds the zone closed and published",
    "fedshard_zone_pushes_total": "Pushes the zone accepted and counted",
    "fedshard_zone_received_bytes_total": "Bytes of the shards of accepted pushes",
    "fedshard_zone_shards_total": "Shards of accepted pushes, by shard class and the pushing site's jurisdiction",
    "fedshard_zone_refusals_total": "Calls and pushes the zone refused, by refusal code",
    "fedshard_zone_forwarded_shards_total": "Partial sums of global shards forwarded to the reducing zone",
    "fedshard_zone_forwarded_bytes_total": "Bytes of the partial sums forwarded to the reducing zone",
    "fedshard_zone_partials_received_total": "Partial sums received from other zones (reducing zone)",
    "fedshard_zone_aggregates_served_total": "Aggregates the zone served to sites",
    "fedshard_zone_fold_seconds": "Seconds folding one accepted push into the round's sums",
    "fedshard_zone_close_seconds": "Seconds closing one round (forwarding partial sums, publishing aggregates)",
}
"""Every series a zone exports, with its help text (the README's table lists the same)."""


class ZoneCollector(Collector):
    """Exports the zones ``zones()`` returns (asked at every scrape: zones come and go)."""

    def __init__(self, zones: Callable[[], Iterable[ZoneAggregator]]) -> None:
        self._zones = zones

    def collect(self) -> Iterator[Metric]:
        """The families of :data:`ZONE_METRICS`, one series per zone (and label values)."""
        zones = sorted(self._zones(), key=lambda z: z.name)
        info = _gauge("fedshard_zone_info", ["zone", "region", "reducing"])
        counters = {
            name: _counter(name, ["zone"])
            for name in (
                "fedshard_zone_rounds_closed",
                "fedshard_zone_pushes",
                "fedshard_zone_received_bytes",
                "fedshard_zone_forwarded_shards",
                "fedshard_zone_forwarded_bytes",
                "fedshard_zone_partials_received",
                "fedshard_zone_aggregates_served",
            )
        }
        gauges = {name: _gauge(name, ["zone"]) for name in ("fedshard_zone_round", "fedshard_zone_open_rounds")}
        shards = _counter("fedshard_zone_shards", ["zone", "shard_class", "origin"])
        refusals = _counter("fedshard_zone_refusals", ["zone", "code"])
        for zone in zones:
            stats, label = zone.stats, [zone.name]
            reducing = zone.residency is not None and zone.residency.is_reducer
            info.add_metric([zone.name, zone.region, str(reducing).lower()], 1)
            gauges["fedshard_zone_round"].add_metric(label, stats.round)
            gauges["fedshard_zone_open_rounds"].add_metric(label, zone.open_rounds)
            values = {
                "fedshard_zone_rounds_closed": stats.rounds_closed,
                "fedshard_zone_pushes": stats.pushes,
                "fedshard_zone_received_bytes": stats.bytes_received,
                "fedshard_zone_forwarded_shards": stats.forwarded_shards,
                "fedshard_zone_forwarded_bytes": stats.forwarded_bytes,
                "fedshard_zone_partials_received": stats.partials_received,
                "fedshard_zone_aggregates_served": stats.served,
            }
            for name, value in values.items():
                counters[name].add_metric(label, value)
            for (shard_class, origin), n in sorted(stats.shards.items()):
                shards.add_metric([zone.name, shard_class, origin or "unknown"], n)
            for code, n in sorted(stats.refusal_codes.items()):
                refusals.add_metric([zone.name, code], n)
        yield info
        yield from gauges.values()
        yield from counters.values()
        yield shards
        yield refusals
        yield _histograms("fedshard_zone_fold_seconds", [(z.name, z.stats.fold_seconds) for z in zones])
        yield _histograms("fedshard_zone_close_seconds", [(z.name, z.stats.close_seconds) for z in zones])


def _gauge(name: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, ZONE_METRICS[name], labels=labels)


def _counter(name: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, ZONE_METRICS[f"{name}_total"], labels=labels)


def _histograms(name: str, by_zone: list[tuple[str, Histogram]]) -> Metric:
    """One histogram family from each zone's own histogram, its series labelled with the zone."""
    family = Metric(name, ZONE_METRICS[name], "histogram")
    for zone, histogram in by_zone:
        for metric in histogram.collect():
            for sample in metric.samples:
                family.add_sample(sample.name, {"zone": zone, **sample.labels}, sample.value)
    return family
