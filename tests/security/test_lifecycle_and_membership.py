"""Issue 13, items 1, 4, 7 and 8: who may drive a round, who may push, forward and fetch,
that every refusal is audited and counted, malformed headers, forged contributors.

Each attack runs against real ``fedshard zone up`` processes with mutual TLS, with a
certificate the federation CA signed: a member site's (``mayo-rochester``, US), a
zone's, or an outsider's (``mallory``, not in the federation). Each asserts the attack
is refused with PERMISSION_DENIED (code ``authority``/``member``), recorded in the
zone's audit log and counted, and that the honest round goes on unharmed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from fedshard.crypto.signing import load_signing_key
from fedshard.errors import FedshardError, PushRejectedError, RefusalCode
from fedshard.integrity.merkle import merkle_root
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc._status import GRPC_STATUS, error_from_rpc
from fedshard.zone.rpc.client import GrpcZoneClient
from tests.security.conftest import OUTSIDER, LiveFederation
from tests.zone_helpers import partial_from

pytestmark = pytest.mark.slow

ATTACKER = "mayo-rochester"  # a member site (US) with a valid certificate


def _raw(client: GrpcZoneClient, method: str, frames: Iterator[pb.PushFrame]) -> FedshardError:
    """Send hand-made frames (what an attacker can send); the zone's refusal."""
    try:
        getattr(client._stub, method)(frames, timeout=30)
    except grpc.RpcError as exc:
        return error_from_rpc(exc, client.endpoint)
    raise AssertionError(f"{method} was accepted")


def _header(body: bytes, token: str) -> Iterator[pb.PushFrame]:
    return iter([pb.PushFrame(header=pb.PushHeader(manifest=body, round_token=token))])


def _refused(records: list[dict], call: str, code: RefusalCode) -> list[dict]:
    return [r for r in records if r["decision"] == "refused" and r.get("call") == call and r.get("code") == code]


def test_a_site_cannot_open_close_or_abort_a_round(federation: LiveFederation) -> None:
    spec = federation.spec(1)
    # opening first with its own token (the coordinator's open would then fail)
    with federation.client("eu-central", ATTACKER) as c, pytest.raises(PushRejectedError) as info:
        c.open_round(federation.spec(1))
    assert info.value.code is RefusalCode.AUTHORITY
    assert GRPC_STATUS[info.value.code] is grpc.StatusCode.PERMISSION_DENIED
    federation.open_round(spec)  # the coordinator's open is unaffected
    honest = federation.push("charite-berlin", "eu-central", spec, seed=1)
    federation.push(ATTACKER, "us-east", spec, seed=2)
    # aborting, closing right after its own push, closing at us-east with a dead forward endpoint
    with federation.client("eu-central", ATTACKER) as c:
        for attempt in (lambda: c.abort_round(1), lambda: c.close_round(1)):
            with pytest.raises(PushRejectedError) as info:
                attempt()
            assert info.value.code is RefusalCode.AUTHORITY
    with federation.client("us-east", ATTACKER) as c, pytest.raises(PushRejectedError) as info:
        c.close_round(1, forward_to=("eu-central", "127.0.0.1:9"))
    assert info.value.code is RefusalCode.AUTHORITY
    # a zone certificate may not drive rounds either
    with federation.client("eu-central", "us-east") as c, pytest.raises(PushRejectedError) as info:
        c.abort_round(1)
    assert info.value.code is RefusalCode.AUTHORITY

    # the round is intact: the next honest push is accepted and the aggregate holds every site
    federation.push("ap-hp-paris", "eu-central", spec, seed=3)
    groups = federation.close_round(1)
    assert set(groups["regional/EU"].sites) == {"charite-berlin", "ap-hp-paris"}
    assert ATTACKER in groups["global"].sites
    with federation.client("eu-central", "charite-berlin") as c:
        means = c.fetch(1, "regional/EU").means
    sid = next(iter(means))
    assert sid in honest or sid in federation.update("ap-hp-paris", "eu-central", 3)

    records = federation.audit("eu-central")
    assert len(_refused(records, "open-round", RefusalCode.AUTHORITY)) == 1
    assert len(_refused(records, "abort-round", RefusalCode.AUTHORITY)) == 2  # the site's and the zone's
    assert len(_refused(records, "close-round", RefusalCode.AUTHORITY)) == 1
    assert any(r["decision"] == "open-round" and r["by"] == "coordinator:coordinator" for r in records)
    assert any(r["decision"] == "close-round" and r["by"] == "coordinator:coordinator" for r in records)
    assert all(r["by"] == f"site:{ATTACKER}" for r in _refused(records, "open-round", RefusalCode.AUTHORITY))
    assert _refused(federation.audit("us-east"), "close-round", RefusalCode.AUTHORITY)
    assert federation.info("eu-central")["refused"] >= 4


def test_only_a_member_zone_may_forward_and_only_to_the_reducing_zone(federation: LiveFederation) -> None:
    spec = federation.spec(1)
    federation.open_round(spec)
    for zone, who, code in [
        ("eu-central", ATTACKER, RefusalCode.AUTHORITY),  # a site posing as a zone
        ("us-east", "eu-central", RefusalCode.AUTHORITY),  # us-east does not reduce
        ("eu-central", OUTSIDER, RefusalCode.MEMBER),
    ]:
        with federation.client(zone, who) as c:
            error = _raw(c, "Forward", _header(b'{"zone": "us-east"}', spec.token))
        assert error.code is code, error
        assert _refused(federation.audit(zone), "forward", code)


def test_a_certificate_of_a_non_member_can_neither_push_nor_fetch(federation: LiveFederation) -> None:
    spec = federation.spec(1)
    federation.open_round(spec)
    federation.push("charite-berlin", "eu-central", spec)
    federation.close_round(1)
    for group in ("regional/EU", "global"):
        with federation.client("eu-central", OUTSIDER) as c, pytest.raises(PushRejectedError) as info:
            c.fetch(1, group)
        assert info.value.code is RefusalCode.MEMBER
        assert GRPC_STATUS[info.value.code] is grpc.StatusCode.PERMISSION_DENIED
    shards = federation.update("charite-berlin", "eu-central")
    manifest = federation.manifest("charite-berlin", "eu-central", spec, shards)
    with federation.client("eu-central", OUTSIDER) as c, pytest.raises(PushRejectedError) as info:
        c.push(manifest, spec.token, shards)
    assert info.value.code is RefusalCode.MEMBER
    records = federation.audit("eu-central")
    assert len(_refused(records, "fetch", RefusalCode.MEMBER)) == 2
    assert len(_refused(records, "push", RefusalCode.MEMBER)) == 1
    by = [r["by"] for r in _refused(records, "fetch", RefusalCode.MEMBER)]
    assert by == [f"site:{OUTSIDER}"] * 2
    # the member site is still served, and the fetch is audited
    with federation.client("eu-central", "charite-berlin") as c:
        assert c.fetch(1, "regional/EU").means
    served = [r for r in federation.audit("eu-central") if r["decision"] == "served"]
    assert served and served[-1]["by"] == "site:charite-berlin" and served[-1]["group"] == "regional/EU"


def test_malformed_and_empty_manifests_are_refused_with_one_line(federation: LiveFederation) -> None:
    spec = federation.spec(1)
    federation.open_round(spec)
    nested = b"[" * 100_000 + b"]" * 100_000
    shards = federation.update("charite-berlin", "eu-central")
    valid = federation.manifest("charite-berlin", "eu-central", spec, shards)
    empty = dataclasses.replace(valid, shards=(), merkle_root=merkle_root({}), signature=None)
    key = load_signing_key(federation.keys.site("charite-berlin").signing_key)
    with federation.client("eu-central", "charite-berlin") as c:
        for body in (nested, b'{"format": 1', empty.signed(key).to_bytes()):
            error = _raw(c, "Push", _header(body, spec.token))
            assert error.code is RefusalCode.MALFORMED, error
            assert "\n" not in str(error) and "Traceback" not in str(error)
        assert "lists no shards" in str(error)
    assert len(_refused(federation.audit("eu-central"), "push", RefusalCode.MALFORMED)) == 3
    federation.push("charite-berlin", "eu-central", spec)  # still accepted afterwards
    assert federation.info("eu-central")["pushes"] == 1


def test_frame_and_identity_refusals_are_audited_and_counted(federation: LiveFederation) -> None:
    spec = federation.spec(1)
    federation.open_round(spec)
    shards = federation.update("charite-berlin", "eu-central")
    manifest = federation.manifest("charite-berlin", "eu-central", spec, shards)
    with federation.client("eu-central", "ap-hp-paris") as c, pytest.raises(PushRejectedError) as info:
        c.push(manifest, spec.token, shards)  # a member site pushing in another member's name
    assert info.value.code is RefusalCode.IDENTITY
    altered = {sid: v.copy() for sid, v in shards.items()}
    first = next(iter(altered))
    altered[first].flat[0] += 1.0  # not what the signed manifest's digest says
    with federation.client("eu-central", "charite-berlin") as c, pytest.raises(PushRejectedError) as info:
        c.push(manifest, spec.token, altered)
    assert info.value.code is RefusalCode.DIGEST
    records = federation.audit("eu-central")
    assert _refused(records, "push", RefusalCode.IDENTITY)[0]["by"] == "site:ap-hp-paris"
    digest = _refused(records, "push", RefusalCode.DIGEST)
    assert len(digest) == 1 and digest[0]["site"] == "charite-berlin" and first in digest[0]["reason"]
    info_now = federation.info("eu-central")
    assert info_now["refused"] == 2 and info_now["pushes"] == 0
    federation.push("charite-berlin", "eu-central", spec)  # the refusals left nothing behind
    assert federation.info("eu-central")["pushes"] == 1


def test_a_zone_cannot_claim_a_contributor_that_never_routed_through_it(federation: LiveFederation) -> None:
    spec = federation.spec(1)
    federation.open_round(spec)
    # a global shard that reaches eu-central as a partial sum from us-east (mayo-rochester's)
    sid = next(
        s for s, d in federation.routing.site(ATTACKER).routes.items() if d.zone == "us-east" and d.scope == "global"
    )
    sums = {sid: np.zeros(federation.routing.plan.shard(sid).shape, np.float64)}
    # an EU site routes to eu-central itself; the other is no site of the federation
    for claimed, code in (("charite-berlin", RefusalCode.RESIDENCY), ("not-a-site", RefusalCode.IDENTITY)):
        partial = partial_from(
            sums, weight=spec.weight_for(claimed), zone="us-east", token=spec.token, sites=(claimed,)
        )
        with federation.client("eu-central", "us-east") as c, pytest.raises(PushRejectedError) as info:
            c.forward(partial, sums)
        assert info.value.code is code, info.value
    refused = [r for r in federation.audit("eu-central") if r["decision"] == "refused" and r["call"] == "forward"]
    assert len(refused) == 2 and {r["by"] for r in refused} == {"zone:us-east"}
    # the round goes on: the honest forward (closing us-east) carries mayo-rochester alone
    federation.push(ATTACKER, "us-east", spec)
    federation.push("charite-berlin", "eu-central", spec)
    groups = federation.close_round(1)
    assert set(groups["global"].sites) == {ATTACKER, "charite-berlin"}
