"""Control-plane messages: closed sets are enums on the Python side and their plain values on the wire."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from fedshard.privacy.accountant import AccountantKind
from fedshard.protocol.messages import (
    ApplyRule,
    PrivacyPlan,
    PrivacyReport,
    PrivacyStatus,
    SiteInfo,
    decode,
    encode,
)
from fedshard.protocol.rounds import AggregateKey


def _report(status: PrivacyStatus) -> PrivacyReport:
    return PrivacyReport(epsilon_budget=4.0, delta=1e-5, epsilon_spent=1.5, status=status)


@pytest.mark.parametrize("status", list(PrivacyStatus))
def test_a_privacy_status_crosses_the_wire_as_its_value_and_comes_back_typed(status: PrivacyStatus) -> None:
    wire = json.loads(encode(_report(status)))
    assert wire["status"] == status.value and type(wire["status"]) is str
    back = decode(PrivacyReport, encode(_report(status)))
    assert back.status is status


def test_the_privacy_statuses_keep_their_wire_values() -> None:
    # events.jsonl and summary.json hold these strings: they never change
    assert [s.value for s in PrivacyStatus] == ["active", "exhausted", "refused"]
    assert PrivacyReport(epsilon_budget=1.0, delta=1e-5, epsilon_spent=0.0).status is PrivacyStatus.ACTIVE


def test_a_status_outside_the_closed_set_is_refused() -> None:
    body = json.loads(encode(_report(PrivacyStatus.ACTIVE)))
    body["status"] = "paused"
    with pytest.raises(ValidationError, match="status"):
        decode(PrivacyReport, json.dumps(body))


def test_the_apply_rule_and_the_accountant_are_their_enums() -> None:
    rule = decode(ApplyRule, b'{"kind": "adam", "learning_rate": 0.1}')
    assert rule.kind == "adam"
    assert json.loads(encode(rule))["kind"] == "adam"
    assert ApplyRule().kind == "avg"
    with pytest.raises(ValidationError, match="'sgd' is not a server optimiser this party knows"):
        decode(ApplyRule, b'{"kind": "sgd"}')  # a site never runs a rule it has not registered

    plan = PrivacyPlan(accountant=AccountantKind.RDP, epsilon=2.0, delta=1e-5, batch_size=32, epochs=1)
    assert json.loads(encode(plan))["accountant"] == "rdp"
    assert decode(PrivacyPlan, encode(plan)).accountant == AccountantKind.RDP
    with pytest.raises(ValidationError, match="accountant"):
        decode(PrivacyPlan, encode(plan).replace(b'"rdp"', b'"gdp"'))


def _info(view: dict) -> SiteInfo:  # type: ignore[type-arg]
    return SiteInfo(
        site_id="s1",
        jurisdiction="EU",
        num_examples=10,
        plan_digest="p",
        plan_json="{}",
        genesis_version="g",
        view=view,
    )


def test_a_sites_view_is_keyed_by_aggregate_key_and_written_zone_bar_group() -> None:
    view = {AggregateKey("eu-central", "regional/EU"): ["fc1.weight#r0c0"], AggregateKey("us-east", "global"): ["b"]}

    wire = json.loads(encode(_info(view)))
    back = decode(SiteInfo, encode(_info(view)))

    assert wire["view"] == {"eu-central|regional/EU": ["fc1.weight#r0c0"], "us-east|global": ["b"]}
    assert back.view == view and all(type(k) is AggregateKey for k in back.view)
    assert SiteInfo(**_info(view).model_dump(mode="json")).view == view  # as an event log replays it


def test_a_malformed_view_key_is_refused_on_decode() -> None:
    with pytest.raises(ValidationError, match=r"malformed aggregate key 'eu-central': expected zone\|group"):
        decode(SiteInfo, encode(_info({})).replace(b'"view":{}', b'"view":{"eu-central":["b"]}'))
