"""Conversions between zone messages and fedshard's dataclasses, and chunking."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

from fedshard.config import ZoneLimits
from fedshard.integrity import ShardEntry
from fedshard.integrity.aggregate_signature import AggregateSignature
from fedshard.protocol.rounds import DEFAULT_GROUP, AggregateSummary, ShardPayload
from fedshard.zone.frames import Buffer, Chunk, shard_chunks
from fedshard.zone.rpc import zone_pb2 as pb

__all__ = [
    "CHUNK_BYTES",
    "GRPC_OPTIONS",
    "STREAM_WINDOW",
    "chunk_of",
    "chunks",
    "encode_chunk_frame",
    "header_to_summary",
    "push_frames",
    "receive_limit",
    "server_options",
    "summary_to_header",
]

CHUNK_BYTES = 1 << 20
_CHUNK_FIELDS = 64 << 10  # a chunk's shard id, offset, dtype and shape, with room to spare
_MAX_SEND = 64 << 20  # what the zone sends: chunks of CHUNK_BYTES; CloseRound's summaries (~120 bytes a shard)
_FRAMES_IN_FLIGHT = 4
STREAM_WINDOW = _FRAMES_IN_FLIGHT * (CHUNK_BYTES + _CHUNK_FIELDS)
"""The HTTP/2 window a receiver opens on each stream from the start: a few chunk frames,
so that the sender streams the next while the receiver's handler checks one (gRPC's
default opens 64 KiB and grows it only as its bandwidth probe sees fit). A zone holds at
most this much of a stream beyond what its handler took: ``streams_per_party`` of them
per caller."""
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_SEND),
    ("grpc.max_receive_message_length", _MAX_SEND),
    ("grpc.http2.lookahead_bytes", STREAM_WINDOW),
    # A zone that restarts is back within seconds: reconnect soon, not after gRPC's
    # default backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
"""A client's channel options (it receives what a zone sends; it reconnects quickly)."""


def receive_limit(header_bytes: int) -> int:
    """The largest message a zone receives: a chunk of :data:`CHUNK_BYTES` with its
    fields, or a header (a push's manifest, ~140 bytes a shard) of ``header_bytes``."""
    return max(CHUNK_BYTES + _CHUNK_FIELDS, header_bytes)


def server_options(limits: ZoneLimits) -> list[tuple[str, int]]:
    """A zone server's options: it receives no message over :func:`receive_limit` of
    ``limits.header_mb``, opens each stream's window to :data:`STREAM_WINDOW`, owns its
    port alone, and bounds its connections by ``limits``: the TLS handshake
    (``handshake_s``), time without a call (``connection_idle_s``), age (``connection_age_s``,
    then as long again for the calls in flight) and keepalive pings (``keepalive_s``,
    unanswered for as long again: closed)."""

    def ms(seconds: float) -> int:
        return round(seconds * 1000)

    return [
        ("grpc.so_reuseport", 0),  # gRPC's default would let a second zone share the port of a running one
        ("grpc.max_send_message_length", _MAX_SEND),
        ("grpc.max_receive_message_length", receive_limit(limits.header_mb << 20)),
        ("grpc.http2.lookahead_bytes", STREAM_WINDOW),
        ("grpc.server_handshake_timeout_ms", ms(limits.handshake_s)),
        ("grpc.max_connection_idle_ms", ms(limits.connection_idle_s)),
        ("grpc.max_connection_age_ms", ms(limits.connection_age_s)),
        ("grpc.max_connection_age_grace_ms", ms(limits.connection_age_s)),
        ("grpc.keepalive_time_ms", ms(limits.keepalive_s)),
        ("grpc.keepalive_timeout_ms", ms(limits.keepalive_s)),
    ]


def chunks(
    shards: Mapping[str, ShardPayload], chunk_bytes: int = CHUNK_BYTES, encrypted: Collection[str] = ()
) -> Iterator[pb.ShardChunk]:
    """Cut shards into chunks; the first chunk of each names its dtype and shape (ciphertext,
    the shards in ``encrypted``: the :data:`~fedshard.crypto.he.ENCRYPTED_DTYPE` label, no shape)."""
    for shard_id, values in shards.items():
        for c in shard_chunks(shard_id, values, chunk_bytes, encrypted=shard_id in encrypted):
            data = c.data if isinstance(c.data, bytes) else bytes(c.data)
            yield pb.ShardChunk(shard_id=c.shard_id, offset=c.offset, data=data, dtype=c.dtype, shape=c.shape)


def push_frames(
    header: pb.PushHeader,
    shards: Mapping[str, ShardPayload],
    chunk_bytes: int = CHUNK_BYTES,
    encrypted: Collection[str] = (),
) -> Iterator[bytes]:
    """A push's (or forward's) stream as serialised :class:`PushFrame` s: the header, then the
    shards cut as by :func:`chunks`.

    A chunk frame is written straight from a memoryview slice of the shard by
    :func:`encode_chunk_frame`: one copy of its bytes, where building a ``ShardChunk`` costs
    two (``bytes`` of the slice, then protobuf's serialisation). The bytes are those
    protobuf would write, so a zone parses them as any other ``PushFrame``.
    """
    yield pb.PushFrame(header=header).SerializeToString()
    yield from _chunk_frames(shards, chunk_bytes, encrypted)


def aggregate_frames(
    header: pb.AggregateHeader,
    shards: Mapping[str, ShardPayload],
    chunk_bytes: int = CHUNK_BYTES,
    encrypted: Collection[str] = (),
) -> Iterator[bytes]:
    """An aggregate's stream as a zone serves it, as serialised :class:`AggregateFrame` s: the
    header, then the shards cut as by :func:`chunks`, each chunk frame written as
    :func:`push_frames` writes it (``AggregateFrame.chunk`` is field 2, as ``PushFrame.chunk``),
    one at a time as the stream takes them."""
    yield pb.AggregateFrame(header=header).SerializeToString()
    yield from _chunk_frames(shards, chunk_bytes, encrypted)


def _chunk_frames(shards: Mapping[str, ShardPayload], chunk_bytes: int, encrypted: Collection[str]) -> Iterator[bytes]:
    for shard_id, values in shards.items():
        for c in shard_chunks(shard_id, values, chunk_bytes, encrypted=shard_id in encrypted):
            yield encode_chunk_frame(c)


def encode_chunk_frame(c: Chunk) -> bytes:
    """``PushFrame(chunk=ShardChunk(...)).SerializeToString()`` of ``c`` (the same bytes as an
    ``AggregateFrame``'s), with the data copied once, from its buffer into the result
    (protobuf's field order and proto3 defaults: empty and zero fields are left out)."""
    data = memoryview(c.data)
    head = bytearray()
    if c.shard_id:
        _put_len(head, 1, c.shard_id.encode())
    if c.offset:
        head += b"\x10"
        _put_varint(head, c.offset)
    if data.nbytes:
        head += b"\x1a"
        _put_varint(head, data.nbytes)
    tail = bytearray()
    if c.dtype:
        _put_len(tail, 4, c.dtype.encode())
    if c.shape:
        packed = bytearray()
        for d in c.shape:
            _put_varint(packed, d)
        _put_len(tail, 5, packed)
    outer = bytearray(b"\x12")  # PushFrame.chunk, field 2, length-delimited
    _put_varint(outer, len(head) + data.nbytes + len(tail))
    return b"".join((outer, head, data, tail))


def _put_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _put_len(out: bytearray, field: int, payload: Buffer) -> None:
    """A length-delimited field (wire type 2)."""
    out.append(field << 3 | 2)
    _put_varint(out, len(payload))
    out += payload


def chunk_of(message: pb.ShardChunk) -> Chunk:
    """Protobuf → :class:`~fedshard.zone.frames.Chunk` (the data is not copied)."""
    return Chunk(message.shard_id, message.offset, message.data, message.dtype, tuple(message.shape))


def summary_to_header(summary: AggregateSummary) -> pb.AggregateHeader:
    """AggregateSummary → protobuf."""
    signed = summary.signature
    return pb.AggregateHeader(
        zone=summary.zone,
        round=summary.round,
        merkle_root=summary.merkle_root,
        total_weight=summary.total_weight,
        sites=list(summary.sites),
        shards=[
            pb.ShardDigest(shard_id=e.shard_id, digest=e.digest, nbytes=e.nbytes, encrypted=e.encrypted)
            for e in summary.shards
        ],
        group=summary.group,
        signature=(
            pb.ZoneSignature(statement=signed.statement, signature=signed.signature, certificate=signed.certificate)
            if signed is not None
            else None
        ),
    )


def header_to_summary(header: pb.AggregateHeader) -> AggregateSummary:
    """Protobuf → AggregateSummary."""
    return AggregateSummary(
        zone=header.zone,
        round=header.round,
        merkle_root=header.merkle_root,
        total_weight=header.total_weight,
        sites=tuple(header.sites),
        shards=tuple(ShardEntry(s.shard_id, s.digest, s.nbytes, encrypted=s.encrypted) for s in header.shards),
        group=header.group or DEFAULT_GROUP,
        signature=(
            AggregateSignature(header.signature.statement, header.signature.signature, header.signature.certificate)
            if header.HasField("signature")
            else None
        ),
    )
