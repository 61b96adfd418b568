"""The call guard on a real gRPC zone over mutual TLS, in this process: one site holding
idle and trickling streams, or unary and fetch calls whose request never comes, is refused
and ended while another site's calls complete."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedshard.audit import AuditLog
from fedshard.config import ZoneLimits
from fedshard.crypto.pki import init_ca, issue_coordinator, issue_site, issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.errors import RefusalCode
from fedshard.protocol.rounds import RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc._guard import RESERVE_WORKERS, pool_size
from fedshard.zone.rpc._status import REFUSAL_CODE_KEY
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.convert import GRPC_OPTIONS
from fedshard.zone.rpc.service import SERVICE, ZoneService, serve
from tests.zone_helpers import BASE, TOKEN, manifest_for, random_update

PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32)}, tile=(4, 4))
LIMITS = ZoneLimits(streams_per_party=2, calls_per_party=2, idle_s=1.0, grace_s=2.0, min_rate_kib_s=64)
ATTACK = 40  # idle streams one site opens: well beyond its limit and the pool (2 parties x 2 + 16 workers)


@pytest.fixture()
def pki(tmp_path: Path) -> dict[str, TlsFiles]:
    ca = init_ca(tmp_path / "ca")
    zone = issue_zone(tmp_path / "ca", "eu-1", "EU", tmp_path / "zones")
    coordinator = issue_coordinator(tmp_path / "ca", "EU", tmp_path / "coordinator")
    files = {
        "zone": TlsFiles(zone.cert, zone.key, ca.cert),
        "coordinator": TlsFiles(coordinator.cert, coordinator.key, ca.cert),
    }
    for site in ("site-a", "site-b"):
        paths = issue_site(tmp_path / "ca", site, "EU", tmp_path / "sites")
        files[site] = TlsFiles(paths.cert, paths.key, ca.cert)
    return files


@pytest.fixture()
def zone(tmp_path: Path, pki: dict[str, TlsFiles]) -> Iterator[tuple[ZoneAggregator, str]]:
    aggregator = ZoneAggregator("eu-1", "EU", audit=AuditLog(tmp_path / "audit.jsonl"))
    server, port = serve(aggregator, "127.0.0.1:0", tls=pki["zone"], limits=LIMITS, parties=2)
    try:
        yield aggregator, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
        aggregator.close()


def _outcome(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    codes = [str(v) for k, v in (error.trailing_metadata() or ()) if k == REFUSAL_CODE_KEY]
    return error.code(), codes[0] if codes else ""


def _until(condition: object, what: str) -> None:
    for _ in range(400):
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def _refused(tmp_path: Path) -> list[dict[str, object]]:
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("decision") == "refused"]


def test_one_site_holding_idle_streams_is_refused_and_ended_while_another_site_pushes_and_fetches(
    zone: tuple[ZoneAggregator, str], pki: dict[str, TlsFiles], tmp_path: Path
) -> None:
    aggregator, endpoint = zone
    with GrpcZoneClient(endpoint, timeout=30, tls=pki["coordinator"]) as coordinator:
        coordinator.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a", "site-b")))
    hang_up = threading.Event()
    outcomes: list[tuple[grpc.StatusCode, str]] = []

    def silent() -> Iterator[pb.PushFrame]:
        hang_up.wait(60)
        yield from ()

    channel = grpc.secure_channel(endpoint, pki["site-b"].channel(), options=GRPC_OPTIONS)
    stub = pb_grpc.ZoneStub(channel)  # type: ignore[no-untyped-call]

    def attack() -> None:
        try:
            stub.Push(silent(), timeout=60)
        except grpc.RpcError as exc:
            outcomes.append(_outcome(exc))

    threads = [threading.Thread(target=attack) for _ in range(ATTACK)]
    try:
        for t in threads:
            t.start()
        _until(lambda: aggregator.stats.refused >= ATTACK - LIMITS.streams_per_party, "the surplus refused")
        update = random_update(1, PLAN)
        with GrpcZoneClient(endpoint, timeout=30, tls=pki["site-a"]) as honest:
            receipt = honest.push(manifest_for("site-a", update, plan=PLAN), TOKEN, update)
            assert receipt.site_id == "site-a"
        for t in threads:
            t.join(30)
    finally:
        hang_up.set()
        channel.close()
    limited = (grpc.StatusCode.RESOURCE_EXHAUSTED, RefusalCode.LIMIT.value)
    idle = (grpc.StatusCode.DEADLINE_EXCEEDED, "")  # a cancelled call carries no trailers: status and reason only
    assert sorted(outcomes, key=str) == sorted([limited] * (ATTACK - 2) + [idle] * 2, key=str)
    refused = _refused(tmp_path)
    assert sorted(r["code"] for r in refused) == ["idle"] * 2 + ["limit"] * (ATTACK - 2)
    assert {r["by"] for r in refused} == {"site:site-b"} and {r["call"] for r in refused} == {"push"}
    assert aggregator.stats.refused == ATTACK

    with GrpcZoneClient(endpoint, timeout=30, tls=pki["coordinator"]) as coordinator:
        coordinator.close_round(1)
        assert coordinator.details()["refused"] == ATTACK
    with GrpcZoneClient(endpoint, timeout=30, tls=pki["site-a"]) as honest:
        np.testing.assert_array_equal(honest.fetch(1).means["w#r0c0"], update["w#r0c0"])


def test_a_trickling_push_is_ended_its_staging_returned_and_the_site_can_push_again(
    zone: tuple[ZoneAggregator, str], pki: dict[str, TlsFiles], tmp_path: Path
) -> None:
    aggregator, endpoint = zone
    update = random_update(2, PLAN)
    manifest = manifest_for("site-b", update, plan=PLAN)
    with GrpcZoneClient(endpoint, timeout=30, tls=pki["coordinator"]) as client:
        client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a", "site-b")))
    stop = threading.Event()

    def trickle() -> Iterator[pb.PushFrame]:
        yield pb.PushFrame(header=pb.PushHeader(manifest=manifest.to_bytes(), round_token=TOKEN))
        data = update["w#r0c0"].tobytes()
        for offset in range(len(data)):
            if stop.wait(0.3):
                return
            first = offset == 0
            yield pb.PushFrame(
                chunk=pb.ShardChunk(
                    shard_id="w#r0c0",
                    offset=offset,
                    data=data[offset : offset + 1],
                    dtype="<f4" if first else "",
                    shape=[4, 4] if first else [],
                )
            )

    channel = grpc.secure_channel(endpoint, pki["site-b"].channel(), options=GRPC_OPTIONS)
    try:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.ZoneStub(channel).Push(trickle(), timeout=60)  # type: ignore[no-untyped-call]
    finally:
        stop.set()
        channel.close()
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "KiB/s" in (info.value.details() or "")
    _until(lambda: aggregator.round_state.budget._used == 0, "the staging bytes returned")
    [record] = _refused(tmp_path)
    assert (record["code"], record["by"]) == ("idle", "site:site-b")
    with GrpcZoneClient(endpoint, timeout=30, tls=pki["site-b"]) as client:  # nothing of the push is left behind
        assert client.push(manifest, TOKEN, update).site_id == "site-b"


def test_every_method_of_the_service_is_registered_to_be_admitted_before_its_request_is_read() -> None:
    handlers = ZoneService(ZoneAggregator("eu-1", "EU")).handlers()
    assert set(handlers) == set(pb.DESCRIPTOR.services_by_name["Zone"].methods_by_name)
    assert all(h.request_streaming for h in handlers.values())  # gRPC reads nothing before the handler runs


def test_a_pool_sized_for_the_membership_grows_with_it_and_never_shrinks() -> None:
    pool = futures.ThreadPoolExecutor(max_workers=pool_size(LIMITS, 2))
    service = ZoneService(ZoneAggregator("eu-1", "EU"), limits=LIMITS, pool=pool)
    service._fit_pool(10)  # what a Reconfigure that brings 10 sites and zones does
    assert pool._max_workers == pool_size(LIMITS, 10) == 10 * 4 + 2 + RESERVE_WORKERS
    service._fit_pool(3)
    assert pool._max_workers == pool_size(LIMITS, 10)
    pool.shutdown()


def test_calls_whose_request_never_comes_are_refused_beyond_the_allowance_and_ended_when_idle(
    zone: tuple[ZoneAggregator, str], pki: dict[str, TlsFiles], tmp_path: Path
) -> None:
    aggregator, endpoint = zone
    hang_up = threading.Event()
    outcomes: dict[str, list[tuple[grpc.StatusCode, str]]] = {}

    def held() -> Iterator[bytes]:
        hang_up.wait(60)
        yield from ()

    channel = grpc.secure_channel(endpoint, pki["site-b"].channel(), options=GRPC_OPTIONS)

    def attack(method: str) -> None:
        path = f"/{SERVICE}/{method}"
        try:
            if method == "FetchAggregate":  # server-streaming: the reply iterator waits on the zone
                list(
                    channel.stream_stream(path, request_serializer=bytes, response_deserializer=bytes)(
                        held(), timeout=60
                    )
                )
            else:
                channel.stream_unary(path, request_serializer=bytes, response_deserializer=bytes)(held(), timeout=60)
        except grpc.RpcError as exc:
            outcomes.setdefault(method, []).append(_outcome(exc))

    methods = ["OpenRound", "CloseRound", "Info", "Reconfigure"] * 3 + ["FetchAggregate"] * 6
    threads = [threading.Thread(target=attack, args=(m,)) for m in methods]
    try:
        for t in threads:
            t.start()
        with GrpcZoneClient(endpoint, timeout=30, tls=pki["coordinator"]) as coordinator:
            coordinator.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a", "site-b")))
            update = random_update(1, PLAN)
            with GrpcZoneClient(endpoint, timeout=30, tls=pki["site-a"]) as honest:
                assert honest.push(manifest_for("site-a", update, plan=PLAN), TOKEN, update).site_id == "site-a"
            assert coordinator.close_round(1)[0].sites == ("site-a",)
        for t in threads:
            t.join(30)
    finally:
        hang_up.set()
        channel.close()

    limited = (grpc.StatusCode.RESOURCE_EXHAUSTED, RefusalCode.LIMIT.value)
    idle = (grpc.StatusCode.DEADLINE_EXCEEDED, "")
    unary = [o for m, found in outcomes.items() if m != "FetchAggregate" for o in found]
    assert sorted(unary, key=str) == sorted([idle] * 2 + [limited] * 10, key=str)
    assert sorted(outcomes["FetchAggregate"], key=str) == sorted([idle] * 2 + [limited] * 4, key=str)
    refused = _refused(tmp_path)
    assert {r["by"] for r in refused} == {"site:site-b"}
    assert sorted(r["code"] for r in refused) == ["idle"] * 4 + ["limit"] * 14
    assert aggregator.stats.refused == 18
