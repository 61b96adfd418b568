"""Issue 13, item 3: one site holding many idle streams must not freeze a zone.

Against real ``fedshard zone up`` processes with mutual TLS: a member site
(``mayo-rochester``) opens far more Push streams than the zone has workers and sends
nothing on them. Meanwhile an honest site pushes, the coordinator asks Info and closes
the round, and the honest site fetches its aggregate. The surplus streams are refused
with RESOURCE_EXHAUSTED (code ``limit``), the admitted ones ended with
DEADLINE_EXCEEDED (``idle``), and every refusal is in the zone's audit log and its
``refused`` counter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from fedshard.errors import RefusalCode
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc.convert import GRPC_OPTIONS
from fedshard.zone.rpc.status import REFUSAL_CODE_KEY
from tests.security.conftest import LiveFederation, live_federation

pytestmark = pytest.mark.slow

ATTACKER = "mayo-rochester"
HONEST = "charite-berlin"
ZONE = "eu-central"
PER_PARTY = 2
STREAMS = 64  # well beyond the pool: (4 sites + 3 zones) x 2 + 16 = 30 workers
LIMITS = {"streams_per_party": PER_PARTY, "idle_s": 2.0, "grace_s": 4.0}


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[LiveFederation]:
    def small_limits(data: dict[str, Any]) -> None:
        for zone in data["zones"]:
            zone["limits"] = dict(LIMITS)

    fed = live_federation(tmp_path, edit=small_limits)
    fed.start()
    try:
        yield fed
    finally:
        fed.stop()


def test_idle_streams_of_one_site_are_refused_and_ended_while_honest_calls_complete(
    federation: LiveFederation,
) -> None:
    fed = federation
    spec = fed.spec(1)
    fed.open_round(spec)
    hang_up = threading.Event()
    outcomes: list[tuple[grpc.StatusCode, str]] = []

    def silent() -> Iterator[pb.PushFrame]:
        hang_up.wait(120)
        yield from ()

    channel = grpc.secure_channel(fed.endpoints[ZONE], fed.tls(ATTACKER).channel(), options=GRPC_OPTIONS)
    stub = pb_grpc.ZoneStub(channel)  # type: ignore[no-untyped-call]

    def attack() -> None:
        try:
            stub.Push(silent(), timeout=120)
        except grpc.RpcError as exc:
            codes = [str(v) for k, v in (exc.trailing_metadata() or ()) if k == REFUSAL_CODE_KEY]
            outcomes.append((exc.code(), codes[0] if codes else ""))

    threads = [threading.Thread(target=attack) for _ in range(STREAMS)]
    try:
        for t in threads:
            t.start()
        for _ in range(600):  # the surplus reached the zone and was refused
            if fed.info(ZONE)["refused"] >= STREAMS - PER_PARTY:
                break
            time.sleep(0.1)
        # while the attacker's admitted streams are still held: honest calls complete
        assert fed.info(ZONE)["name"] == ZONE
        pushed = {site: {z: fed.push(site, z, spec) for z in fed.routes(site)} for site in fed.sites}
        for t in threads:
            t.join(60)
    finally:
        hang_up.set()
        channel.close()

    limited = (grpc.StatusCode.RESOURCE_EXHAUSTED, RefusalCode.LIMIT.value)
    idle = (grpc.StatusCode.DEADLINE_EXCEEDED, "")  # ended by cancel: status and reason, no trailers
    assert sorted(outcomes, key=str) == sorted([limited] * (STREAMS - PER_PARTY) + [idle] * PER_PARTY, key=str)

    summaries = fed.close_round(1)
    served = [s for s in summaries.values() if s.zone == ZONE and HONEST in s.sites]
    assert served
    with fed.client(ZONE, HONEST) as client:
        for summary in served:
            assert client.fetch(1, summary.group).summary.merkle_root == summary.merkle_root
    assert set(pushed[HONEST]) and all(HONEST in s.sites for s in served)

    refused = [r for r in fed.audit(ZONE) if r.get("decision") == "refused"]
    by_code = sorted(r["code"] for r in refused if r.get("by") == f"site:{ATTACKER}")
    assert by_code == ["idle"] * PER_PARTY + ["limit"] * (STREAMS - PER_PARTY)
    assert {r["call"] for r in refused} == {"push"}
    assert fed.info(ZONE)["refused"] == STREAMS
