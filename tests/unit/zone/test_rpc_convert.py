"""Push frames serialised by hand (``convert.push_frames``) are the bytes protobuf writes; summaries
keep their zone signature on the wire."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedshard.config import ZoneLimits
from fedshard.integrity import ShardEntry
from fedshard.integrity.aggregate_signature import AggregateSignature
from fedshard.protocol.rounds import AggregateSummary
from fedshard.zone.frames import Chunk
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc.convert import (
    GRPC_OPTIONS,
    STREAM_WINDOW,
    chunks,
    encode_chunk_frame,
    header_to_summary,
    push_frames,
    receive_limit,
    server_options,
    summary_to_header,
)

HEADER = pb.PushHeader(manifest=b"manifest", round_token="token")


def _protobuf(shards: dict, chunk_bytes: int, encrypted: set[str]) -> list[bytes]:
    frames = [pb.PushFrame(header=HEADER)] + [pb.PushFrame(chunk=c) for c in chunks(shards, chunk_bytes, encrypted)]
    return [f.SerializeToString() for f in frames]


@pytest.mark.parametrize("chunk_bytes", [1, 7, 128, 1 << 20])
def test_frames_match_protobuf(chunk_bytes: int) -> None:
    shards = {
        "w#r0c0": np.arange(300, dtype=np.float32).reshape(3, 100),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "big-endian": np.arange(10, dtype=">f8"),
        "scalar": np.float64(2.5).reshape(()),
        "ciphertext": bytes(range(256)) * 3,
    }
    ours = list(push_frames(HEADER, shards, chunk_bytes, {"ciphertext"}))
    assert ours == _protobuf(shards, chunk_bytes, {"ciphertext"})
    parsed = [pb.PushFrame.FromString(f) for f in ours[1:]]
    assert b"".join(f.chunk.data for f in parsed if f.chunk.shard_id == "w#r0c0") == shards["w#r0c0"].tobytes()


@given(
    shard_id=st.text(max_size=40),
    offset=st.integers(0, 2**64 - 1),
    data=st.binary(max_size=300),
    dtype=st.text(max_size=8),
    shape=st.lists(st.integers(0, 2**32 - 1), max_size=5),
)
def test_any_chunk_encodes_as_protobuf_does(
    shard_id: str, offset: int, data: bytes, dtype: str, shape: list[int]
) -> None:
    chunk = Chunk(shard_id, offset, memoryview(data), dtype, tuple(shape))
    expected = pb.PushFrame(chunk=pb.ShardChunk(shard_id=shard_id, offset=offset, data=data, dtype=dtype, shape=shape))
    assert encode_chunk_frame(chunk) == expected.SerializeToString()


def test_a_stream_window_holds_several_whole_chunk_frames() -> None:
    options = dict(server_options(ZoneLimits(header_mb=16)))
    assert options["grpc.max_receive_message_length"] == receive_limit(16 << 20)
    assert options["grpc.http2.lookahead_bytes"] == STREAM_WINDOW == dict(GRPC_OPTIONS)["grpc.http2.lookahead_bytes"]
    assert 2 * receive_limit(0) <= STREAM_WINDOW  # the next frame streams while the handler checks one


def test_an_aggregate_summary_keeps_its_zone_signature_on_the_wire() -> None:
    entries = (ShardEntry("w#r0c0", "d" * 64, 48),)
    unsigned = AggregateSummary("eu-1", 3, "r" * 64, 6.0, ("a", "b"), entries, "global")
    signature = AggregateSignature(b'{"format":1}', b"\x30\x45" + bytes(69), b"-----BEGIN CERTIFICATE-----\n")
    for summary in (unsigned, replace(unsigned, signature=signature)):
        wire = summary_to_header(summary).SerializeToString()
        assert header_to_summary(pb.AggregateHeader.FromString(wire)) == summary
    assert not summary_to_header(unsigned).HasField("signature")


def test_a_zone_server_bounds_its_connections_by_its_limits() -> None:
    limits = ZoneLimits(connection_idle_s=120, connection_age_s=600, keepalive_s=30, handshake_s=5)
    options = dict(server_options(limits))
    assert options["grpc.server_handshake_timeout_ms"] == 5_000
    assert options["grpc.max_connection_idle_ms"] == 120_000
    assert options["grpc.max_connection_age_ms"] == options["grpc.max_connection_age_grace_ms"] == 600_000
    assert options["grpc.keepalive_time_ms"] == options["grpc.keepalive_timeout_ms"] == 30_000
