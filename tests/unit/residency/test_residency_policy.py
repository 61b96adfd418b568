"""Residency policy: defaults, protection conditions, first match, fail closed, digest, config errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedshard.config import PolicyRule, Protection, ResidencyConfig, default_rules, load_model, parse_model
from fedshard.errors import ConfigError
from fedshard.residency import ANY_REGION, Policy, ShardProtection, refusal

NONE = ShardProtection()
ENCRYPTED = ShardProtection(encrypted=True)


def _rule(**kwargs: object) -> PolicyRule:
    data: dict[str, object] = {"class": "*", "allow_regions": "*", "serve_to": "*"}
    data.update(kwargs)
    return PolicyRule.model_validate(data)


@pytest.fixture
def defaults() -> Policy:
    return Policy.from_config(ResidencyConfig())


@pytest.mark.parametrize("shard_class", ["personal", "restricted"])
def test_defaults_keep_eu_personal_data_in_the_eu(defaults: Policy, shard_class: str) -> None:
    decision = defaults.decide(shard_class, "EU", NONE)
    assert decision.rule_index == 0
    assert decision.allowed_regions == frozenset({"EU"})
    assert decision.serve_to == frozenset({"EU"})
    assert "eu-personal-data-stays-in-eu" in decision.reason
    for region, ok in [("EU", True), ("US", False), ("UK", False), ("SG", False)]:
        assert defaults.permits_region(shard_class, "EU", NONE, region)[0] is ok
    assert defaults.may_serve(shard_class, "EU", NONE, "EU")
    assert not defaults.may_serve(shard_class, "EU", NONE, "US")
    # encryption does not relax the default rule
    assert not defaults.permits_region(shard_class, "EU", ENCRYPTED, "US")[0]


@pytest.mark.parametrize(("shard_class", "origin"), [("personal", "US"), ("public", "EU"), ("genomic", "EU")])
def test_defaults_let_everything_else_go_anywhere(defaults: Policy, shard_class: str, origin: str) -> None:
    decision = defaults.decide(shard_class, origin, NONE)
    assert decision.rule_index == 1
    assert decision.allowed_regions == ANY_REGION
    assert defaults.permits_region(shard_class, origin, NONE, "US") == (True, decision.reason)
    assert defaults.may_serve(shard_class, origin, NONE, "SG")


def test_refusal_text(defaults: Policy) -> None:
    ok, text = defaults.permits_region("personal", "EU", NONE, "US", shard_id="fc1.weight#r0c0")
    assert not ok
    assert text == "residency: shard fc1.weight#r0c0 (personal, origin EU) may not be received in region US"
    assert text == refusal("fc1.weight#r0c0", "personal", "EU", "US")
    assert defaults.permits_region("personal", "EU", NONE, "US")[1].startswith("residency: a personal shard")


def test_update_dp_condition() -> None:
    policy = Policy(
        [
            _rule(**{"class": "personal", "protection": {"update_dp_max_epsilon": 2.0}}),
            _rule(**{"class": "personal", "allow_regions": ["EU"], "serve_to": ["EU"]}),
        ]
    )
    assert policy.decide("personal", "EU", ShardProtection(update_dp_epsilon=1.0)).rule_index == 0
    assert policy.decide("personal", "EU", ShardProtection(update_dp_epsilon=2.0)).rule_index == 0
    assert policy.decide("personal", "EU", ShardProtection(update_dp_epsilon=2.5)).rule_index == 1
    assert policy.decide("personal", "EU", NONE).rule_index == 1
    assert policy.permits_region("personal", "EU", ShardProtection(update_dp_epsilon=1.0), "US")[0]
    assert not policy.permits_region("personal", "EU", ShardProtection(update_dp_epsilon=3.0), "US")[0]
    assert "update DP ε ≤ 2" in policy.decide("personal", "EU", ShardProtection(update_dp_epsilon=1.0)).reason


def test_encrypted_condition() -> None:
    policy = Policy(
        [
            _rule(**{"class": "personal", "protection": {"encrypted": True}, "serve_to": ["EU"]}),
            _rule(**{"class": "personal", "protection": {"encrypted": False}, "allow_regions": ["EU"]}),
        ]
    )
    assert policy.decide("personal", "EU", ENCRYPTED).rule_index == 0
    assert policy.decide("personal", "EU", NONE).rule_index == 1
    assert policy.permits_region("personal", "EU", ENCRYPTED, "US")[0]
    assert not policy.permits_region("personal", "EU", NONE, "US")[0]
    assert not policy.may_serve("personal", "EU", ENCRYPTED, "US")
    assert policy.may_serve("personal", "EU", NONE, "US")


def test_first_match_wins() -> None:
    policy = Policy(
        [
            _rule(**{"class": ["personal"], "origin": ["EU"], "allow_regions": ["EU"], "preferred_zone": "eu-1"}),
            _rule(**{"class": "personal", "allow_regions": ["US"]}),
            _rule(),
        ]
    )
    first = policy.decide("personal", "EU", NONE)
    assert (first.rule_index, first.allowed_regions, first.preferred_zone) == (0, frozenset({"EU"}), "eu-1")
    assert policy.decide("personal", "UK", NONE).allowed_regions == frozenset({"US"})
    assert policy.decide("public", "EU", NONE).rule_index == 2


def test_fail_closed_when_no_rule_matches() -> None:
    policy = Policy([_rule(**{"class": "public"}), _rule(**{"origin": ["US"]})])
    decision = policy.decide("personal", "EU", NONE)
    assert decision.rule_index is None
    assert decision.allowed_regions == frozenset()
    assert decision.serve_to == frozenset()
    assert "no residency rule matches class personal, origin EU" in decision.reason
    for region in ("EU", "US", "SG"):
        assert not policy.permits_region("personal", "EU", NONE, region)[0]
        assert not policy.may_serve("personal", "EU", NONE, region)
    assert not Policy([]).permits_region("public", "EU", NONE, "EU")[0]


def test_deny_rule_allows_no_region() -> None:
    policy = Policy([_rule(**{"class": "genomic", "allow_regions": [], "serve_to": []}), _rule()])
    decision = policy.decide("genomic", "US", NONE)
    assert decision.rule_index == 0
    assert not decision.permits("US")
    assert "regions none" in decision.reason


def test_protection_defaults_to_none(defaults: Policy) -> None:
    assert defaults.decide("personal", "EU") == defaults.decide("personal", "EU", NONE)
    with pytest.raises(ValueError, match="positive finite"):
        ShardProtection(update_dp_epsilon=0.0)


# digest ------------------------------------------------------------------------------------
def test_digest_is_stable(defaults: Policy) -> None:
    assert Policy(default_rules()).digest == defaults.digest
    assert len(defaults.digest) == 64
    rebuilt = Policy([PolicyRule.model_validate(r.canonical()) for r in defaults.rules])
    assert rebuilt.digest == defaults.digest
    # another interpreter, another hash seed: the same digest
    code = "from fedshard.residency import Policy; from fedshard.config import default_rules; "
    code += "print(Policy(default_rules()).digest)"
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == defaults.digest


@pytest.mark.parametrize(
    "change",
    [
        {"allow_regions": ["EU", "UK"]},
        {"serve_to": "*"},
        {"origin": ["EU", "UK"]},
        {"protection": Protection(encrypted=True)},
        {"preferred_zone": "eu-central"},
        {"shard_class": ["personal"]},
        {"name": "renamed"},
    ],
)
def test_digest_changes_with_any_field(defaults: Policy, change: dict[str, object]) -> None:
    rules = list(defaults.rules)
    rules[0] = rules[0].model_copy(update=change)
    assert Policy(rules).digest != defaults.digest


def test_digest_depends_on_rule_order(defaults: Policy) -> None:
    rules = [_rule(**{"class": "public"}), _rule(**{"class": "personal", "allow_regions": ["EU"]})]
    assert Policy(rules).digest != Policy(rules[::-1]).digest
    assert Policy(rules) == Policy(list(rules))


# config ------------------------------------------------------------------------------------
def test_yaml_shape_loads(tmp_path: Path) -> None:
    text = """
classes:
  - pattern: "fc1.*"
    class: personal
    reason: sees lab values
rules:
  - name: eu-personal
    class: [personal, restricted]
    origin: [EU]
    allow_regions: [EU]
    preferred_zone: eu-central
    serve_to: [EU]
  - class: personal
    origin: [US]
    protection: {encrypted: true, update_dp_max_epsilon: 8}
    allow_regions: "*"
    serve_to: "*"
  - class: "*"
    allow_regions: "*"
    serve_to: "*"
"""
    path = tmp_path / "residency.yaml"
    path.write_text(text)
    config = load_model(ResidencyConfig, path)
    assert config.classes[0].shard_class == "personal"
    assert config.detectors is True
    assert len(config.rules) == 3  # the file's rules replace the defaults
    policy = Policy.from_config(config)
    protected = ShardProtection(encrypted=True, update_dp_epsilon=4.0)
    assert policy.decide("personal", "US", protected).rule_index == 1
    assert policy.decide("personal", "US", NONE).rule_index == 2
    assert policy.decide("restricted", "EU", protected).preferred_zone == "eu-central"
    assert yaml.safe_load(text)["rules"][0] == {
        k: v for k, v in config.rules[0].canonical().items() if k != "protection"
    }


def test_defaults_are_used_when_rules_are_omitted() -> None:
    assert ResidencyConfig().rules == default_rules()
    config = ResidencyConfig(rules=[_rule(**{"class": "genomic", "allow_regions": ["EU"]}), *default_rules()])
    assert len(config.rules) == 3


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"rules": [{"class": "Personal", "allow_regions": "*", "serve_to": "*"}]}, "rules.0.class"),
        ({"rules": [{"class": ["personal", "X"], "allow_regions": "*", "serve_to": "*"}]}, "'X' in the list"),
        ({"rules": [{"class": [], "allow_regions": "*", "serve_to": "*"}]}, "class must not be empty"),
        ({"rules": [{"class": "x", "origin": "EU", "allow_regions": "*", "serve_to": "*"}]}, "rules.0.origin"),
        ({"rules": [{"class": "x", "origin": [], "allow_regions": "*", "serve_to": "*"}]}, "origin must not be"),
        ({"rules": [{"class": "x", "allow_regions": ["eu"], "serve_to": "*"}]}, "rules.0.allow_regions"),
        ({"rules": [{"class": "x", "allow_regions": "*"}]}, "rules.0.serve_to: required key is missing"),
        ({"rules": [{"class": "x", "allow_regions": "*", "serve_to": "*", "zone": "a"}]}, "rules.0.zone: unknown"),
        (
            {"rules": [{"class": "x", "allow_regions": "*", "serve_to": "*", "protection": {"encrypted": "maybe"}}]},
            "rules.0.protection.encrypted",
        ),
        (
            {
                "rules": [
                    {"class": "x", "allow_regions": "*", "serve_to": "*", "protection": {"update_dp_max_epsilon": 0}}
                ]
            },
            "rules.0.protection.update_dp_max_epsilon",
        ),
        ({"rules": []}, "rules: Value error, must not be empty"),
        (
            {
                "rules": [
                    {"class": "*", "allow_regions": "*", "serve_to": "*"},
                    {"class": "x", "allow_regions": [], "serve_to": []},
                ]
            },
            "rule 1 can never match",
        ),
        ({"classes": [{"pattern": "fc1.*", "class": "PII"}]}, "classes.0.class"),
        ({"classes": [{"pattern": "", "class": "personal"}]}, "classes.0.pattern"),
        ({"detector": False}, "detector: unknown key"),
    ],
)
def test_config_errors_are_one_line(data: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_model(ResidencyConfig, data, "residency.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("residency.yaml: ")
    assert expected in message


def test_config_is_frozen() -> None:
    config = ResidencyConfig()
    with pytest.raises(ValueError):
        config.detectors = False  # type: ignore[misc]
