"""Prometheus metrics as an operator scrapes them: from a live zone during a round, and
from a simulation while it runs (zones and the run's own series), over real HTTP."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedshard.config import load_federation
from fedshard.coordinator.results import RoundResult
from fedshard.errors import PushRejectedError
from fedshard.observability.run_metrics import RUN_METRICS, RunCollector
from fedshard.observability.server import MetricsServer
from fedshard.observability.zone_metrics import ZONE_METRICS, ZoneCollector
from fedshard.protocol.messages import SiteInfo
from fedshard.protocol.rounds import RoundSpec
from fedshard.run_folder.resume import with_rounds
from fedshard.sharding import ShardPlan
from fedshard.simulate.run import simulate
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc.client import GrpcZoneClient
from tests.metrics_helpers import Samples, families, scrape, value
from tests.zone_helpers import BASE, TOKEN, manifest_for, random_update

ROOT = Path(__file__).resolve().parents[2]
PLAN = ShardPlan.from_state_dict({"w": np.zeros((40, 30), np.float32), "b": np.zeros(30, np.float32)}, tile=(32, 32))


def test_a_live_zone_exports_the_documented_series_with_what_it_counted(
    grpc_zone: tuple[ZoneAggregator, str],
) -> None:
    zone, endpoint = grpc_zone
    with MetricsServer([ZoneCollector(lambda: [zone])], 0) as metrics, GrpcZoneClient(endpoint, timeout=20) as client:
        idle = scrape(metrics.url)
        assert value(idle, "fedshard_zone_round", zone=zone.name) == 0
        assert value(idle, "fedshard_zone_pushes_total", zone=zone.name) == 0

        client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a", "site-b"), weights=()))
        update = random_update(1, PLAN)
        manifest = manifest_for("site-a", update, plan=PLAN, zone=zone.name)
        client.push(manifest, TOKEN, update)
        with pytest.raises(PushRejectedError):  # a second site with the wrong round token
            other = random_update(2, PLAN)
            client.push(manifest_for("site-b", other, plan=PLAN, zone=zone.name), "not-the-token", other)

        during = scrape(metrics.url)  # the round is open
        label = {"zone": zone.name}
        assert value(during, "fedshard_zone_round", **label) == 1
        assert value(during, "fedshard_zone_open_rounds", **label) == 1
        assert value(during, "fedshard_zone_pushes_total", **label) == 1
        assert value(during, "fedshard_zone_received_bytes_total", **label) == manifest.total_bytes
        shards = value(during, "fedshard_zone_shards_total", shard_class="unclassified", origin="unknown", **label)
        assert shards == len(PLAN.shard_ids)
        assert value(during, "fedshard_zone_refusals_total", code="token", **label) == 1
        assert value(during, "fedshard_zone_fold_seconds_count", **label) == 1
        assert 0 < value(during, "fedshard_zone_fold_seconds_sum", **label) < 60
        assert value(during, "fedshard_zone_close_seconds_count", **label) == 0
        assert value(during, "fedshard_zone_info", region=zone.region, reducing="false", **label) == 1

        client.close_round(1)
        client.fetch(1, site_id="site-a")
        after = scrape(metrics.url)
        assert value(after, "fedshard_zone_open_rounds", **label) == 0
        assert value(after, "fedshard_zone_rounds_closed_total", **label) == 1
        assert value(after, "fedshard_zone_close_seconds_count", **label) == 1
        assert value(after, "fedshard_zone_aggregates_served_total", **label) == 1
        assert set(ZONE_METRICS) <= families(after), families(after)


class _Scraper:
    """A round observer that scrapes the simulation's metrics when round ``at`` finishes."""

    def __init__(self, server: MetricsServer, at: int) -> None:
        self.server, self.at = server, at
        self.samples: Samples = {}

    def on_start(self, sites: list[SiteInfo], rounds: int, genesis_version: str) -> None:
        pass

    def on_round(self, result: RoundResult) -> None:
        if result.round == self.at:
            self.samples = scrape(self.server.url)


def test_a_simulation_exports_its_rounds_privacy_and_zones_while_it_runs(tmp_path: Path) -> None:
    config = with_rounds(load_federation(ROOT / "configs" / "demo-dp.yaml"), 3)
    out = tmp_path / "run"
    with MetricsServer([RunCollector(out / "events.jsonl")], 0) as server:
        scraper = _Scraper(server, at=2)
        summary = simulate(config, out, observer=scraper, metrics=server)
    samples = scraper.samples
    assert summary["rounds"] == 3 and samples
    assert value(samples, "fedshard_round") == 2
    assert value(samples, "fedshard_rounds_total", outcome="completed") == 2
    assert value(samples, "fedshard_round_duration_seconds_count") == 2
    assert value(samples, "fedshard_round_phase_seconds_count", phase="train") == 2
    assert value(samples, "fedshard_sites") == value(samples, "fedshard_sites_connected") == 4
    assert value(samples, "fedshard_round_sites") == 4
    assert 0.5 <= value(samples, "fedshard_round_accuracy") <= 1
    assert value(samples, "fedshard_uploaded_bytes_total") == sum(h["bytes_up"] for h in summary["history"][:2])
    assert value(samples, "fedshard_run_finished") == 0
    for site in summary["sites"]:
        spent = value(samples, "fedshard_site_epsilon_spent", site=site["id"])
        assert 0 < spent <= value(samples, "fedshard_site_epsilon_budget", site=site["id"]) == site["epsilon_budget"]
    # the zones of the run, with the classes and origins the residency policy gave their shards; round 2
    # finishes once round 3's train replies (carrying its evaluation) are in: round 3 is pushed, still open
    assert value(samples, "fedshard_zone_round", zone="eu-central") == 3
    pushes = value(samples, "fedshard_zone_pushes_total", zone="eu-central")
    assert pushes == 3 * 4
    personal = value(samples, "fedshard_zone_shards_total", zone="eu-central", shard_class="personal", origin="US")
    assert personal > 0
    assert set(RUN_METRICS) | set(ZONE_METRICS) <= families(samples), families(samples)


def test_the_readme_documents_every_series() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in [*ZONE_METRICS, *RUN_METRICS] if f"`{name}`" not in readme]
    assert not missing, missing
