"""What a running federation may change between rounds (config.changes, routing.check_regrouping)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fedshard.assembly.routing import FederationRouting, check_regrouping
from fedshard.config import FederationConfig
from fedshard.config.changes import check_change
from fedshard.errors import ConfigError

BASE: dict[str, Any] = {
    "federation": {"name": "grow", "seed": 1, "rounds": 5, "min_sites": 2},
    "task": {"target": "clients.tasks.synthetic:task"},
    "zones": [{"name": "eu-central", "region": "EU"}, {"name": "us-east", "region": "US"}],
    "reducing_zone": "eu-central",
    "sites": [
        {"id": "eu-1", "jurisdiction": "EU"},
        {"id": "us-1", "jurisdiction": "US"},
        {"id": "uk-1", "jurisdiction": "UK"},
    ],
}


def _config(**edit: Any) -> FederationConfig:
    data = json.loads(json.dumps(BASE))
    for key, value in edit.items():
        data[key] = value
    return FederationConfig.model_validate(data)


def _with(*, zones: list[dict[str, Any]] | None = None, sites: list[dict[str, Any]] | None = None) -> FederationConfig:
    return _config(zones=[*BASE["zones"], *(zones or [])], sites=[*BASE["sites"], *(sites or [])])


def test_zones_and_sites_may_be_added_and_zones_drained() -> None:
    roomy = _config(federation={**BASE["federation"], "partitions": 4})
    grown = _with(zones=[{"name": "uk-south", "region": "UK"}], sites=[{"id": "uk-2", "jurisdiction": "UK"}])
    change = check_change(roomy, grown.model_copy(update={"federation": roomy.federation}))
    assert change.added_zones == ("uk-south",) and change.added_sites == ("uk-2",) and not change.drained
    assert change.describe() == "zone uk-south added; site(s) uk-2 joined"
    old = _config()
    drained = _config(zones=[BASE["zones"][0], {**BASE["zones"][1], "drain": True}])
    assert check_change(old, drained).drained == ("us-east",)
    assert check_change(drained, old).resumed == ("us-east",)
    more_rounds = _config(federation={**BASE["federation"], "rounds": 9})
    assert check_change(old, more_rounds).rounds == 9
    assert check_change(old, old).empty


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"task": {"target": "clients.tasks.synthetic:task", "options": {"features": 5}}}, "task cannot change"),
        ({"training": {"learning_rate": 0.9}}, "training cannot change"),
        ({"federation": {**BASE["federation"], "seed": 2}}, "federation.seed cannot change"),
        ({"zones": BASE["zones"][:1]}, "zone us-east is missing from the new config"),
        ({"zones": [BASE["zones"][0], {"name": "us-east", "region": "SG"}]}, "zone us-east's region cannot change"),
        ({"sites": BASE["sites"][:2]}, "site uk-1 is missing from the new config"),
        ({"sites": [*BASE["sites"][:2], {"id": "uk-1", "jurisdiction": "SG"}]}, "site uk-1's entry cannot change"),
        (
            {
                "sites": [{"id": "new", "jurisdiction": "EU"}, *BASE["sites"]],
                "federation": {**BASE["federation"], "partitions": 4},
            },
            "federation.partitions cannot change",
        ),
    ],
)
def test_what_a_run_keeps_is_refused_in_one_line(edit: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_change(_config(), _config(**edit))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_site_that_would_recut_the_others_data_is_refused_unless_partitions_were_set() -> None:
    with pytest.raises(ConfigError, match="cut the task's data into 4 parts instead of 3"):
        check_change(_config(), _with(sites=[{"id": "uk-2", "jurisdiction": "UK"}]))
    roomy = {**BASE["federation"], "partitions": 8}
    before = _config(federation=roomy)
    after = _config(federation=roomy, sites=[*BASE["sites"], {"id": "uk-2", "jurisdiction": "UK"}])
    assert check_change(before, after).added_sites == ("uk-2",) and after.num_partitions == 8
    with pytest.raises(ValueError, match=r"site s9 reads data partition 8 but federation\.partitions is 8"):
        _config(federation=roomy, sites=[*BASE["sites"], {"id": "s9", "jurisdiction": "EU", "partition": 8}])


def test_the_reducing_zone_cannot_be_drained() -> None:
    with pytest.raises(ValueError, match="the reducing zone eu-central cannot be drained"):
        _config(zones=[{**BASE["zones"][0], "drain": True}, BASE["zones"][1]])


def test_a_zone_change_may_move_first_hops_never_aggregates() -> None:
    old = FederationRouting(_config())
    # a UK zone: the UK site pushes there first, its aggregates stay the global ones
    grown = FederationRouting(_with(zones=[{"name": "uk-south", "region": "UK"}]), old.classes)
    check_regrouping(old, grown)
    assert {d.zone for d in grown.site("uk-1").routes.values()} == {"uk-south"}
    assert {d.zone for d in old.site("uk-1").routes.values()} == {"eu-central"}
    # draining it again sends them back to the reducing zone
    drained = _with(zones=[{"name": "uk-south", "region": "UK", "drain": True}])
    check_regrouping(grown, FederationRouting(drained, old.classes))
    # a second EU zone that sorts first would take the EU personal aggregates: refused
    with pytest.raises(ConfigError, match="site eu-1 would apply other aggregates"):
        check_regrouping(old, FederationRouting(_with(zones=[{"name": "eu-a", "region": "EU"}]), old.classes))
    # draining the only US zone leaves the US site's shards a zone (the reducing one): allowed
    us_drained = _config(zones=[BASE["zones"][0], {**BASE["zones"][1], "drain": True}])
    check_regrouping(old, FederationRouting(us_drained, old.classes))
