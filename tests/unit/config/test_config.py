"""Config loading: valid files load; bad input gives one line naming key and file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedshard.config import FULL_BATCH, FederationConfig, load_federation
from fedshard.errors import ConfigError

DEMO = Path(__file__).resolve().parents[3] / "configs" / "demo.yaml"


def _base() -> dict:
    return yaml.safe_load(DEMO.read_text())


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "fed.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_demo_config_loads() -> None:
    cfg = load_federation(DEMO)
    assert isinstance(cfg, FederationConfig)
    assert [s.jurisdiction for s in cfg.sites].count("EU") == 2
    assert cfg.sharding.tile == (32, 32)
    assert cfg.num_partitions == 4


def test_defaults_live_in_the_model(tmp_path: Path) -> None:
    data = {
        "task": {"target": "a.b:c"},
        "zones": [{"name": "z", "region": "EU"}],
        "sites": [{"id": "s", "jurisdiction": "EU"}, {"id": "t", "jurisdiction": "US"}],
    }
    cfg = load_federation(_write(tmp_path, data))
    assert cfg.federation.rounds == 10
    assert cfg.sharding.tile == (256, 256)
    assert cfg.zones[0].endpoint == "127.0.0.1:0"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["federation"].update(roundz=3), "federation.roundz: unknown key"),
        (lambda d: d["federation"].update(rounds=0), "federation.rounds"),
        (lambda d: d["sharding"].update(tile=[0, 4]), "sharding.tile"),
        (lambda d: d["sites"].append(dict(d["sites"][0])), "site ids must be unique"),
        (lambda d: d["federation"].update(min_sites=9), "min_sites is 9"),
        (lambda d: d["zones"][0].update(endpoint="nowhere"), "endpoint must be host:port"),
        (lambda d: d["sites"][0].update(jurisdiction="eu"), "sites.0.jurisdiction"),
        (lambda d: d.pop("task"), "task: required key is missing"),
        (lambda d: d["task"].update(target="no-colon"), "task.target"),
        (lambda d: d["federation"].update(sample_fraction=1.5), "federation.sample_fraction"),
        (lambda d: d["training"].update(batch_size=0), "training.batch_size"),
        (lambda d: d["training"].update(batch_size="everything"), "training.batch_size"),
        (
            lambda d: d.update(
                privacy={"record_level": {"enabled": True, "sample_rate": 0.25}, "budget": {"epsilon": 3}}
            ),
            "sample_rate (0.25) makes each round one DP-SGD step over a Poisson sample of all of a site's records: "
            "set training.batch_size: all and training.local_epochs: 1 (got 16 and 2)",
        ),
        (lambda d: d.update(privacy={"record_level": {"enabled": True, "sample_rate": 1.5}}), "sample_rate"),
    ],
)
def test_bad_values_are_one_line_naming_key_and_file(tmp_path: Path, mutate, expected: str) -> None:
    data = _base()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_federation(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert expected in message


def test_a_full_batch_is_written_all_and_sent_as_full_batch(tmp_path: Path) -> None:
    data = _base()
    data["training"]["batch_size"] = "all"
    cfg = load_federation(_write(tmp_path, data))
    assert cfg.training.batch_size == "all" and cfg.training.sent_batch_size == FULL_BATCH
    assert load_federation(DEMO).training.sent_batch_size == 16


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "federation:\n  rounds: [1,\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d"):
        load_federation(path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_federation("/nonexistent/fed.yaml")


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_federation(_write(tmp_path, "- 1\n- 2\n"))


def _with_site(code: str, rules: list[dict] | None = None) -> dict:
    data = _base()
    data["sites"][1]["jurisdiction"] = code  # ap-hp-paris
    if rules is not None:
        data.setdefault("residency", {})["rules"] = rules
    return data


def test_a_member_state_under_rules_for_its_block_is_refused_with_the_code_to_write(tmp_path: Path) -> None:
    """A Paris site written FR under rules that speak of EU would have its personal shards go anywhere."""
    with pytest.raises(ConfigError) as info:
        load_federation(_write(tmp_path, _with_site("FR")))
    message = str(info.value)
    assert "\n" not in message and "site ap-hp-paris: jurisdiction FR is a member of EU" in message
    assert "write `jurisdiction: EU`" in message


def test_an_unknown_code_is_refused_naming_the_regions_that_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_federation(_write(tmp_path, _with_site("EUR")))
    message = str(info.value)
    assert "jurisdiction EUR is no zone's region, no residency rule names it" in message
    assert message.endswith("EU, SG, US") and "\n" not in message


def test_a_code_a_rule_names_or_a_country_no_rule_covers_is_accepted(tmp_path: Path) -> None:
    ours = [
        {"class": "personal", "origin": ["FR"], "allow_regions": ["EU"], "serve_to": ["FR"]},
        {"class": "*", "allow_regions": "*", "serve_to": "*"},
    ]
    assert load_federation(_write(tmp_path, _with_site("FR", ours))).sites[1].jurisdiction == "FR"
    # a country of no block the rules name: the rules for '*' are meant for it (configs/grow.yaml's UK site)
    assert load_federation(_write(tmp_path, _with_site("CH"))).sites[1].jurisdiction == "CH"
    grow = load_federation(DEMO.with_name("grow.yaml"))
    assert "UK" in {s.jurisdiction for s in grow.sites} and "UK" not in {z.region for z in grow.zones}


def test_shared_noise_calibrated_to_budgets_needs_one_budget_for_every_site(tmp_path: Path) -> None:
    """Each site sizes its noise share to its own budget: with different budgets the others' shares would
    cover a record only at the smallest σ, which no ledger accounts."""
    data = yaml.safe_load((DEMO.parent / "demo-dp-he.yaml").read_text())
    assert load_federation(_write(tmp_path, data)).privacy.record_level.distributed_over
    site = data["sites"][1]
    for key, value in (("budget", {"epsilon": 5.0}), ("cap", {"epsilon": 1.0})):
        changed = yaml.safe_load(yaml.safe_dump(data))
        changed["sites"][1][key] = value
        with pytest.raises(ConfigError, match=f"needs one budget for every site, but site {site['id']} has ε="):
            load_federation(_write(tmp_path, changed))
    data["privacy"]["record_level"]["noise_multiplier"] = 2.0  # a fixed σ: every share the same
    data["sites"][1]["budget"] = {"epsilon": 5.0}
    assert load_federation(_write(tmp_path, data)).listed_budget(site["id"]).epsilon == 5.0
