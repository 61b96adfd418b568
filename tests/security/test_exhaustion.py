"""No party can freeze a zone: real ``fedshard zone up`` processes with mutual TLS.

Issue 13, item 3: a member site (``mayo-rochester``) opens far more Push streams than
the zone has workers and sends nothing on them. Meanwhile an honest site pushes, the
coordinator asks Info and closes the round, and the honest site fetches its aggregate.
The surplus streams are refused with RESOURCE_EXHAUSTED (code ``limit``), the admitted
ones ended with DEADLINE_EXCEEDED (``idle``), and every refusal is in the zone's audit
log and its ``refused`` counter.

Issue 32, items 9 and 10: unary calls (OpenRound, CloseRound, Info, Reconfigure) that
never send their request, from a member and from a certificate of no member, and a
thousand idle connections to the zone's metrics port. Each test times the honest work
with and without the attack and prints both; it asserts only that the work completed.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from fedshard.errors import RefusalCode
from fedshard.transports.bounded_http import MAX_CONNECTIONS
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc._status import REFUSAL_CODE_KEY
from fedshard.zone.rpc.convert import GRPC_OPTIONS
from fedshard.zone.rpc.service import SERVICE
from tests.security.conftest import OUTSIDER, LiveFederation, live_federation

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


# -- issue 32, items 9 and 10 ------------------------------------------------------------------------

HELD = 60  # held unary calls from each attacker
UNARY = ("OpenRound", "CloseRound", "Info", "Reconfigure")
CALL_LIMITS = {"streams_per_party": 2, "calls_per_party": 2, "idle_s": 5.0, "grace_s": 8.0}
IDLE_CONNECTIONS = 1000


def _outcome(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    codes = [str(v) for k, v in (error.trailing_metadata() or ()) if k == REFUSAL_CODE_KEY]
    return error.code(), codes[0] if codes else ""


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveFederation]:
    """The federation with small call limits, every zone serving metrics on a free port."""

    def small_limits(data: dict[str, Any]) -> None:
        for zone in data["zones"]:
            zone["limits"] = dict(CALL_LIMITS)

    fed = live_federation(tmp_path_factory.mktemp("crowded"), edit=small_limits)
    fed.zone_args = ["--metrics-port", "0"]
    fed.start()
    try:
        _honest_round(fed, 1)  # warm-up (first connections, imports), so that the rounds timed compare
        yield fed
    finally:
        fed.stop()


def _honest_round(fed: LiveFederation, rnd: int) -> float:
    """As the coordinator, open ``rnd`` at every zone, let HONEST push, ask Info, close;
    HONEST fetches. The seconds it took."""
    started = time.perf_counter()
    spec = fed.spec(rnd, sites=[HONEST])
    fed.open_round(spec)
    for zone in fed.routes(HONEST):
        fed.push(HONEST, zone, spec, seed=rnd)
    assert fed.info(ZONE)["name"] == ZONE
    summaries = fed.close_round(rnd)
    served = [s for s in summaries.values() if s.zone == ZONE and HONEST in s.sites]
    assert served
    with fed.client(ZONE, HONEST) as client:
        assert client.fetch(rnd, served[0].group).summary.merkle_root == served[0].merkle_root
    return time.perf_counter() - started


def _refused_by(fed: LiveFederation, who: str) -> list[dict[str, Any]]:
    return [r for r in fed.audit(ZONE) if r.get("decision") == "refused" and r.get("by") == f"site:{who}"]


def test_held_unary_calls_of_a_member_and_of_a_non_member_do_not_freeze_a_zone(crowded: LiveFederation) -> None:
    fed = crowded
    quiet = _honest_round(fed, 2)
    refused_before = fed.info(ZONE)["refused"]
    hang_up = threading.Event()
    outcomes: dict[str, list[tuple[grpc.StatusCode, str]]] = {ATTACKER: [], OUTSIDER: []}
    channels = {
        who: grpc.secure_channel(fed.endpoints[ZONE], fed.tls(who).channel(), options=GRPC_OPTIONS) for who in outcomes
    }

    def held() -> Iterator[bytes]:  # the call is opened (its headers sent), its request never comes
        hang_up.wait(120)
        yield from ()

    def attack(who: str, method: str) -> Callable[[], None]:
        call = channels[who].stream_unary(f"/{SERVICE}/{method}", request_serializer=bytes, response_deserializer=bytes)

        def run() -> None:
            try:
                call(held(), timeout=120)
            except grpc.RpcError as exc:
                outcomes[who].append(_outcome(exc))

        return run

    threads = [threading.Thread(target=attack(who, UNARY[i % 4])) for who in outcomes for i in range(HELD)]
    try:
        for t in threads:
            t.start()
        for _ in range(600):  # every call the zone refuses at once was refused
            if fed.info(ZONE)["refused"] - refused_before >= 2 * HELD - CALL_LIMITS["calls_per_party"]:
                break
            time.sleep(0.1)
        attacked = _honest_round(fed, 3)  # OpenRound, Push, Info, CloseRound, FetchAggregate
        still_held = sum(t.is_alive() for t in threads)
        for t in threads:
            t.join(60)
    finally:
        hang_up.set()
        for channel in channels.values():
            channel.close()
    print(
        f"\nhonest round (open, push, info, close, fetch) without the attack {quiet:.2f}s, with {2 * HELD} held "
        f"unary calls {attacked:.2f}s; attacker calls still held when it finished: {still_held}"
    )

    allowed = CALL_LIMITS["calls_per_party"]
    limited = (grpc.StatusCode.RESOURCE_EXHAUSTED, RefusalCode.LIMIT.value)
    idle = (grpc.StatusCode.DEADLINE_EXCEEDED, "")  # ended by cancel: status and reason, no trailers
    assert sorted(outcomes[ATTACKER], key=str) == sorted([limited] * (HELD - allowed) + [idle] * allowed, key=str)
    assert outcomes[OUTSIDER] == [(grpc.StatusCode.PERMISSION_DENIED, RefusalCode.MEMBER.value)] * HELD

    member = _refused_by(fed, ATTACKER)
    assert sorted(r["code"] for r in member) == ["idle"] * allowed + ["limit"] * (HELD - allowed)
    outsider = _refused_by(fed, OUTSIDER)
    assert [r["code"] for r in outsider] == ["member"] * HELD
    calls = {"open-round", "close-round", "info", "reconfigure"}
    assert {r["call"] for r in member} <= calls and {r["call"] for r in outsider} == calls
    assert fed.info(ZONE)["refused"] - refused_before == 2 * HELD


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


def test_a_thousand_idle_metrics_connections_cost_the_zone_no_threads_and_its_pushes_complete(
    crowded: LiveFederation,
) -> None:
    fed = crowded
    found = re.search(r"zone metrics: (http://\S+/metrics)", fed.log(ZONE))
    assert found, fed.log(ZONE)
    url = found.group(1)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    zone = psutil.Process(fed.procs[ZONE].pid)
    assert "fedshard_zone_round" in _scrape(url)
    quiet = _honest_round(fed, 4)
    threads_before, fds_before = zone.num_threads(), zone.num_fds()

    idle: list[socket.socket] = []
    reset = 0  # connections the zone closed before connect() returned
    for _ in range(IDLE_CONNECTIONS):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        except ConnectionResetError:
            reset += 1
    try:
        time.sleep(0.5)  # the zone accepted what it serves and closed the rest
        threads_during, fds_during = zone.num_threads(), zone.num_fds()
        attacked = _honest_round(fed, 5)
        started = time.perf_counter()
        scraped = ""
        while not scraped and time.perf_counter() - started < 60:
            try:
                scraped = _scrape(url)
            except OSError:  # closed at once while the idle connections held every slot
                time.sleep(0.2)
        waited = time.perf_counter() - started
    finally:
        for sock in idle:
            sock.close()
    print(
        f"\nhonest round without the attack {quiet:.2f}s, with {IDLE_CONNECTIONS} idle metrics connections "
        f"({reset} reset at connect) "
        f"{attacked:.2f}s; zone threads {threads_before} -> {threads_during}, descriptors {fds_before} -> "
        f"{fds_during}; a scrape answered after {waited:.2f}s"
    )
    assert "fedshard_zone_pushes_total" in scraped
    assert threads_during <= threads_before + 4  # one server thread in all, whatever the connections
    assert fds_during <= fds_before + MAX_CONNECTIONS + 8
