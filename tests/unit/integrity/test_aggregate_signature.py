"""A zone's signed statement of an aggregate: written at close, kept in its store, and checked by
sites against what they fetched (:mod:`fedshard.integrity.aggregate_signature`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.identity import ZoneId
from fedshard.crypto.pki import init_ca, issue_coordinator, issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.errors import IntegrityError
from fedshard.integrity.aggregate_signature import (
    MAX_STATEMENT_BYTES,
    AggregateSignature,
    AggregateSigner,
    AggregateStatement,
    check_aggregate,
)
from fedshard.protocol.rounds import DEFAULT_GROUP, RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from tests.zone_helpers import BASE, TOKEN, manifest_for, random_update

PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32)}, tile=(4, 4))
EU = ZoneId("eu-1", "EU")
ROOT = "ab" * 32


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    tmp = tmp_path_factory.mktemp("pki")
    ca = init_ca(tmp / "ca")
    out = {}
    for name, region in (("eu-1", "EU"), ("us-1", "US")):
        z = issue_zone(tmp / "ca", name, region, tmp / "zones")
        out[name] = TlsFiles(z.cert, z.key, ca.cert)
    wrong = issue_zone(tmp / "ca", "eu-1", "US", tmp / "wrong")
    out["eu-1@US"] = TlsFiles(wrong.cert, wrong.key, ca.cert)
    lead = issue_coordinator(tmp / "ca", "EU", tmp / "coordinator")
    out["coordinator"] = TlsFiles(lead.cert, lead.key, ca.cert)
    return out


def _signer(tls: TlsFiles) -> AggregateSigner:
    cert, key, _ = tls.read()
    return AggregateSigner(key, cert)


def _statement() -> AggregateStatement:
    return AggregateStatement.of("eu-1", "EU", 3, "global", ROOT, 6.0, {"site-b": 2.0, "site-a": 4.0})


def _check(signed: AggregateSignature | None, ca: bytes, **changes: object) -> AggregateStatement:
    expected: dict = {"round": 3, "group": "global", "merkle_root": ROOT, "total_weight": 6.0}
    expected |= {"sites": ("site-a", "site-b")} | changes
    zone = expected.pop("zone", EU)
    return check_aggregate(signed, ca, zone, **expected)  # type: ignore[arg-type]


def test_a_statement_is_canonical_and_reads_back() -> None:
    statement = _statement()
    data = statement.to_bytes()
    assert AggregateStatement.from_bytes(data) == statement
    assert data.index(b'"contributors":{"site-a":4.0,"site-b":2.0}') > 0
    with pytest.raises(IntegrityError, match="canonical"):
        AggregateStatement.from_bytes(data.replace(b'{"contributors"', b'{ "contributors"'))
    for bad in (b"[]", b"not json", data.replace(b'"format":1', b'"format":2'), b'{"format":1,"hash":"blake3"}'):
        with pytest.raises(IntegrityError):
            AggregateStatement.from_bytes(bad)


def test_a_site_accepts_exactly_what_the_zone_signed(pki: dict[str, TlsFiles]) -> None:
    ca = pki["eu-1"].read()[2]
    signed = _signer(pki["eu-1"]).sign(_statement())
    assert _check(signed, ca).contributors == (("site-a", 4.0), ("site-b", 2.0))
    for field, value in [
        ("round", 4),
        ("group", "regional/EU"),
        ("merkle_root", "cd" * 32),
        ("total_weight", 7.0),
        ("sites", ("site-a",)),
        ("zone", ZoneId("eu-1", "US")),
        ("zone", ZoneId("us-1", "US")),
    ]:
        with pytest.raises(IntegrityError) as info:
            _check(signed, ca, **{field: value})
        assert "\n" not in str(info.value), field


@pytest.mark.parametrize(
    ("who", "refusal"),
    [
        ("us-1", "signed by zone us-1 (US), not by the zone"),
        ("eu-1@US", "signed by zone eu-1 (US), not by the zone"),
        ("coordinator", "signed by coordinator coordinator (EU), not by the zone"),
    ],
)
def test_a_signature_by_anyone_but_the_zone_is_refused(pki: dict[str, TlsFiles], who: str, refusal: str) -> None:
    with pytest.raises(IntegrityError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        _check(_signer(pki[who]).sign(_statement()), pki["eu-1"].read()[2])


def test_a_missing_altered_or_oversized_signature_is_refused(pki: dict[str, TlsFiles]) -> None:
    ca = pki["eu-1"].read()[2]
    signed = _signer(pki["eu-1"]).sign(_statement())
    with pytest.raises(IntegrityError, match="not signed by the zone"):
        _check(None, ca)
    flipped = replace(signed, signature=signed.signature[:-1] + bytes([signed.signature[-1] ^ 1]))
    with pytest.raises(IntegrityError, match="does not verify"):
        _check(flipped, ca)
    edited = replace(signed, statement=replace(_statement(), total_weight=7.0, fingerprint="").to_bytes())
    with pytest.raises(IntegrityError, match="names another certificate"):
        _check(edited, ca, total_weight=7.0)
    other_cert = replace(signed, certificate=pki["us-1"].read()[0])
    with pytest.raises(IntegrityError, match="us-1"):
        _check(other_cert, ca)
    with pytest.raises(IntegrityError, match="larger than any a zone writes"):
        _check(replace(signed, statement=b" " * (MAX_STATEMENT_BYTES + 1)), ca)
    assert AggregateSignature.from_json(signed.to_json()) == signed
    with pytest.raises(IntegrityError):
        AggregateSignature.from_json({"statement": "x", "signature": "zz"})


def test_a_zone_signs_what_it_publishes_and_keeps_it_across_a_restart(pki: dict[str, TlsFiles], tmp_path: Path) -> None:
    update = random_update(1, PLAN)
    zone = ZoneAggregator("eu-1", "EU", store_dir=tmp_path, signer=_signer(pki["eu-1"]))
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a",), weights=(("site-a", 3.0),)))
    zone.push(manifest_for("site-a", update, plan=PLAN, weight=3.0), TOKEN, update)
    (summary,) = zone.close_round(1)
    statement = _check(
        summary.signature,
        pki["eu-1"].read()[2],
        round=1,
        group=DEFAULT_GROUP,
        merkle_root=summary.merkle_root,
        total_weight=summary.total_weight,
        sites=("site-a",),
    )
    assert statement.contributors == (("site-a", 3.0),)
    zone.close()
    again = ZoneAggregator("eu-1", "EU", store_dir=tmp_path)  # restarted, without a key even: it serves what it stored
    assert again.fetch(1).summary.signature == summary.signature
    assert again.close_round(1)[0].signature == summary.signature  # a close retried answers the same
