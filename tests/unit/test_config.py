"""Config loading: valid files load; bad input gives one line naming key and file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedshard.config import FederationConfig, load_federation
from fedshard.errors import ConfigError

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


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
