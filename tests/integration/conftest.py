"""Fixtures for integration tests: a zone aggregator served over gRPC on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import zone_pb2_grpc
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve
from tests.readme_walk import VENV, Walk, walk

GRPC_ZONE_NAME = "eu-1"
GRPC_ZONE_REGION = "EU"


@pytest.fixture
def grpc_zone() -> Iterator[tuple[ZoneAggregator, str]]:
    """A zone served on 127.0.0.1 (free port): ``(zone, endpoint)``; stopped afterwards."""
    zone = ZoneAggregator(GRPC_ZONE_NAME, GRPC_ZONE_REGION)
    server, port = serve(zone, "127.0.0.1:0", max_workers=4)
    try:
        yield zone, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(timeout=10)


@pytest.fixture
def zone_client(grpc_zone: tuple[ZoneAggregator, str]) -> Iterator[GrpcZoneClient]:
    """Client of :func:`grpc_zone` that cuts shards into 1000-byte chunks."""
    with GrpcZoneClient(grpc_zone[1], timeout=20, chunk_bytes=1000) as client:
        yield client


@pytest.fixture
def zone_stub(grpc_zone: tuple[ZoneAggregator, str]) -> Iterator[zone_pb2_grpc.ZoneStub]:
    """Raw generated stub of :func:`grpc_zone`, for crafting frames by hand."""
    channel = grpc.insecure_channel(grpc_zone[1])
    try:
        yield zone_pb2_grpc.ZoneStub(channel)
    finally:
        channel.close()


@pytest.fixture(scope="session")
def readme_walk(tmp_path_factory: pytest.TempPathFactory) -> Walk:
    """``make demo``'s recipe and the README's quick blocks, run once as pasted in a fresh
    folder (:mod:`tests.readme_walk`); test_cli reads the runs they made."""
    if not (VENV / "bin" / "fedshard").exists():
        pytest.skip("the README's blocks run .venv/bin/fedshard: run the suite with make test")
    return walk(tmp_path_factory.mktemp("readme") / "walk", slow=False)
