"""Routing a site's shards by the federation's residency policy (what `route explain` shows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedshard.assembly.routing import explain_routes, site_zones
from fedshard.config import FederationConfig
from fedshard.errors import ConfigError

DEMO = Path(__file__).resolve().parents[3] / "configs" / "demo.yaml"


def _three_zones(**extra: object) -> FederationConfig:
    data = yaml.safe_load(DEMO.read_text())
    data["zones"] = [
        {"name": "eu-central", "region": "EU"},
        {"name": "us-east", "region": "US"},
        {"name": "ap-southeast", "region": "SG"},
    ]
    data["reducing_zone"] = "us-east"
    data.update(extra)
    return FederationConfig.model_validate(data)


def test_eu_personal_shards_stay_in_the_eu_and_the_rest_goes_to_the_reducer() -> None:
    decisions = explain_routes(_three_zones(), "charite-berlin")
    by_class = {(d.shard_class, d.zone) for d in decisions}
    assert ("personal", "eu-central") in by_class
    assert all(d.zone == "eu-central" for d in decisions if d.shard_class == "personal")
    assert {d.zone for d in decisions if d.shard_class == "public"} == {"eu-central"}  # own region first
    us = explain_routes(_three_zones(), "mayo-rochester")
    assert {d.zone for d in us} == {"us-east"}


def test_a_sites_zones_are_known_without_its_model_and_agree_with_its_routes() -> None:
    genomic = {
        "classes": [{"pattern": "fc2.*", "class": "genomic"}],
        "rules": [
            {"class": "genomic", "allow_regions": ["SG"], "serve_to": "*"},
            {"class": "*", "allow_regions": ["EU"], "serve_to": "*"},
        ],
    }
    config = _three_zones(residency=genomic)
    zones = site_zones(config, "charite-berlin")
    assert zones == {"eu-central": ["public", "restricted", "personal"], "ap-southeast": ["genomic"]}
    assert {d.zone for d in explain_routes(config, "charite-berlin")} <= set(zones)


def test_config_rules_win_over_detectors_and_tensor_filter() -> None:
    config = _three_zones(residency={"classes": [{"pattern": "fc2.*", "class": "restricted", "reason": "site rule"}]})
    decisions = explain_routes(config, "ap-hp-paris", tensor="fc2.weight")
    assert [d.shard_id for d in decisions] == ["fc2.weight#r0c0", "fc2.weight#r0c1"]
    assert all(d.shard_class == "restricted" and d.allowed_regions == ["EU"] for d in decisions)


def test_unknown_site_or_tensor_is_one_line() -> None:
    with pytest.raises(ConfigError, match="no site 'x'"):
        explain_routes(_three_zones(), "x")
    with pytest.raises(ConfigError, match=r"has no tensor 'fc9\.weight'"):
        explain_routes(_three_zones(), "charite-berlin", tensor="fc9.weight")


def test_reducing_zone_and_preferred_zone_must_be_zones() -> None:
    with pytest.raises(ValueError, match="reducing_zone 'mars'"):
        _three_zones(reducing_zone="mars")


def test_a_sites_view_names_each_aggregate_by_its_key() -> None:
    from fedshard.assembly.routing import FederationRouting
    from fedshard.residency import AggregateKey

    routing = FederationRouting(_three_zones()).site("charite-berlin")
    view = routing.view()

    assert all(type(key) is AggregateKey for key in view)
    assert list(view) == sorted(view)
    assert {sid for shards in view.values() for sid in shards} == set(routing.routes)
    for key, shards in view.items():
        assert all(routing.routes[sid].aggregate == key for sid in shards)
    personal = {sid for sid, d in routing.routes.items() if d.shard_class == "personal"}
    assert personal and {routing.routes[sid].aggregate for sid in personal} == {
        AggregateKey("eu-central", "regional/EU")
    }
