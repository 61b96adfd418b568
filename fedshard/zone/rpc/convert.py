"""Conversions between zone messages and fedshard's dataclasses, and chunking."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from fedshard.errors import PushRejectedError, RefusalCode
from fedshard.integrity import ShardEntry
from fedshard.protocol.rounds import DEFAULT_GROUP, AggregateSummary
from fedshard.zone.rpc import zone_pb2 as pb

__all__ = ["CHUNK_BYTES", "GRPC_OPTIONS", "assemble_frames", "chunks", "header_to_summary", "summary_to_header"]

CHUNK_BYTES = 1 << 20
_MAX_MESSAGE = CHUNK_BYTES + (1 << 20)  # a chunk plus room for its header fields
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


def chunks(shards: Mapping[str, np.ndarray], chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.ShardChunk]:
    """Cut shards into chunks; the first chunk of each shard names its dtype and shape."""
    for shard_id, values in shards.items():
        arr = np.ascontiguousarray(values)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        raw = arr.reshape(-1).view(np.uint8).data  # not memoryview.cast("B"): it refuses zero-size arrays
        total = len(raw)
        shape = [int(d) for d in arr.shape]
        yield pb.ShardChunk(
            shard_id=shard_id, offset=0, data=bytes(raw[:chunk_bytes]), dtype=arr.dtype.str, shape=shape
        )
        for offset in range(chunk_bytes, total, chunk_bytes):
            yield pb.ShardChunk(shard_id=shard_id, offset=offset, data=bytes(raw[offset : offset + chunk_bytes]))


def summary_to_header(summary: AggregateSummary) -> pb.AggregateHeader:
    """AggregateSummary → protobuf."""
    return pb.AggregateHeader(
        zone=summary.zone,
        round=summary.round,
        merkle_root=summary.merkle_root,
        total_weight=summary.total_weight,
        sites=list(summary.sites),
        shards=[pb.ShardDigest(shard_id=e.shard_id, digest=e.digest, nbytes=e.nbytes) for e in summary.shards],
        group=summary.group,
    )


def header_to_summary(header: pb.AggregateHeader) -> AggregateSummary:
    """Protobuf → AggregateSummary."""
    return AggregateSummary(
        zone=header.zone,
        round=header.round,
        merkle_root=header.merkle_root,
        total_weight=header.total_weight,
        sites=tuple(header.sites),
        shards=tuple(ShardEntry(s.shard_id, s.digest, s.nbytes) for s in header.shards),
        group=header.group or DEFAULT_GROUP,
    )


def assemble_frames(
    frames: Iterator[tuple[str, bytes, int, str, tuple[int, ...]]], expected: dict[str, int]
) -> dict[str, np.ndarray]:
    """Reassemble streamed chunks ``(shard_id, data, offset, dtype, shape)`` into arrays.

    ``expected`` gives each shard's byte count; chunks must be contiguous, in order,
    one shard after another. Raises :class:`PushRejectedError` on anything else.
    """
    out: dict[str, np.ndarray] = {}
    current: tuple[str, bytearray, str, tuple[int, ...]] | None = None
    filled = 0

    def finish() -> None:
        assert current is not None
        sid, buf, dtype, shape = current
        if filled != len(buf):
            raise PushRejectedError(f"shard {sid} ended after {filled} of {len(buf)} bytes", RefusalCode.TRUNCATED)
        try:
            out[sid] = np.frombuffer(bytes(buf), dtype=np.dtype(dtype)).reshape(shape)
        except (TypeError, ValueError) as exc:
            raise PushRejectedError(f"shard {sid}: {exc}", RefusalCode.DTYPE) from None

    for sid, data, offset, dtype, shape in frames:
        if current is None or current[0] != sid:
            if current is not None:
                finish()
            if sid in out or sid not in expected:
                raise PushRejectedError(f"shard {sid} is unexpected or sent twice", RefusalCode.UNKNOWN_SHARD)
            if offset != 0:
                raise PushRejectedError(f"shard {sid} starts at offset {offset}", RefusalCode.OFFSET)
            current, filled = (sid, bytearray(expected[sid]), dtype, shape), 0
        if offset != filled or filled + len(data) > len(current[1]):
            raise PushRejectedError(f"shard {sid}: chunk at offset {offset} does not fit", RefusalCode.OFFSET)
        current[1][filled : filled + len(data)] = data
        filled += len(data)
    if current is not None:
        finish()
    missing = set(expected) - set(out)
    if missing:
        raise PushRejectedError(
            f"{len(missing)} partial sum(s) never arrived, e.g. {sorted(missing)[0]}", RefusalCode.MISSING
        )
    return out
