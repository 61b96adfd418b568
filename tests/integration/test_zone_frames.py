"""The one frame assembler on the forward and fetch paths, over real gRPC on loopback.

Forward: hand-made frames to a reducing zone; each broken stream is refused with its
code (in the trailing metadata, and on the client's error) and leaves nothing counted.
Fetch: a zone that serves hand-made aggregate streams; the client refuses each broken
one with a :class:`FrameError` naming the aggregate, the shard and the check (the
stream that starts at offset > 0 included: it used to raise a bare ``KeyError``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest

from fedshard.crypto.he import ENCRYPTED_DTYPE, HeCodec, he_init, load_context
from fedshard.errors import FrameError, IntegrityError, PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import ShardEntry, build_manifest, merkle_root, shard_digest
from fedshard.protocol.rounds import DEFAULT_GROUP, GLOBAL_GROUP, Aggregate, AggregateSummary, PartialSum, RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import service as service_module
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc as pb_grpc
from fedshard.zone.rpc._status import GRPC_STATUS, REFUSAL_CODE_KEY
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.convert import chunks, summary_to_header
from fedshard.zone.rpc.service import ZoneService, serve
from tests.zone_helpers import BASE, FORWARD_WEIGHTS, TOKEN, Shards, manifest_for, partial_from, reducing_policy

SITES = ("site-a", "site-b")
CHUNK = 1000
# w#r0c0 (32, 30): 3840 bytes of float32, 7680 of float64 partial sums; w#r1c0 (8, 30); b#r0c0 (30, 1)
PLAN = ShardPlan.from_state_dict({"w": np.zeros((40, 30), np.float32), "b": np.zeros(30, np.float32)}, tile=(32, 32))
Frames = list[pb.PushFrame]


def sums(seed: int) -> Shards:
    rng = np.random.default_rng(seed)
    return {sid: rng.standard_normal(PLAN.shard(sid).shape) for sid in PLAN.shard_ids}


# forward --------------------------------------------------------------------------------------


@pytest.fixture
def reducer() -> Iterator[tuple[ZoneAggregator, str]]:
    """A reducing zone with round 1 open, served on loopback: ``(zone, endpoint)``."""
    zone = ZoneAggregator("eu-1", "EU", residency=reducing_policy(PLAN, SITES))
    zone.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=FORWARD_WEIGHTS))
    server, port = serve(zone, "127.0.0.1:0", max_workers=4)
    try:
        yield zone, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(timeout=10)


def forward_frames(partial: PartialSum, values: Shards) -> Frames:
    header = pb.PushFrame(header=pb.PushHeader(manifest=partial.to_bytes(), round_token=partial.token))
    return [header, *(pb.PushFrame(chunk=c) for c in chunks(values, CHUNK))]


def shard_frames(frames: Frames, shard_id: str) -> list[int]:
    return [i for i, f in enumerate(frames) if f.WhichOneof("frame") == "chunk" and f.chunk.shard_id == shard_id]


def assert_only_good_forward_counted(zone: ZoneAggregator, endpoint: str) -> None:
    good = sums(99)
    with GrpcZoneClient(endpoint, timeout=20, chunk_bytes=CHUNK) as client:
        assert client.forward(partial_from(good, weight=4.0), good) == len(good)
    (summary,) = zone.close_round(1)
    aggregate = zone.fetch(1, GLOBAL_GROUP, jurisdiction="EU").means

    assert (summary.sites, summary.total_weight) == (("site-a",), 4.0)
    for sid, total in good.items():
        # a partial sum is Σ (w/unit)·x, unit = the round's largest weight (site-a's 4): the mean is total·4/4
        np.testing.assert_array_equal(
            aggregate[sid], (total * max(w for _, w in FORWARD_WEIGHTS) / 4.0).astype(np.float32)
        )


def _cut(shard: str, which: int) -> Callable[[Frames], Frames]:
    def edit(frames: Frames) -> Frames:
        del frames[shard_frames(frames, shard)[which]]
        return frames

    return edit


def _drop(shard: str) -> Callable[[Frames], Frames]:
    def edit(frames: Frames) -> Frames:
        gone = set(shard_frames(frames, shard))
        return [f for i, f in enumerate(frames) if i not in gone]

    return edit


def _move(offset: int) -> Callable[[Frames], Frames]:
    def edit(frames: Frames) -> Frames:
        frames[shard_frames(frames, "w#r0c0")[1]].chunk.offset = offset
        return frames

    return edit


def _tamper(frames: Frames) -> Frames:
    chunk = frames[shard_frames(frames, "w#r0c0")[2]].chunk
    chunk.data = bytes([chunk.data[0] ^ 1]) + chunk.data[1:]
    return frames


def _relabel(**fields: object) -> Callable[[Frames], Frames]:
    def edit(frames: Frames) -> Frames:
        chunk = frames[shard_frames(frames, "b#r0c0")[0]].chunk
        for name, value in fields.items():
            if name == "shape":
                del chunk.shape[:]
                chunk.shape.extend(value)  # type: ignore[call-overload]
            else:
                setattr(chunk, name, value)
        return frames

    return edit


def _twice(frames: Frames) -> Frames:
    frames.append(frames[shard_frames(frames, "b#r0c0")[0]])
    return frames


def _unlisted(frames: Frames) -> Frames:
    frames[shard_frames(frames, "b#r0c0")[0]].chunk.shard_id = "x#r0c0"
    return frames


def _header_twice(frames: Frames) -> Frames:
    frames.insert(3, frames[0])
    return frames


FORWARD_CASES = [
    pytest.param(_cut("w#r0c0", 0), RefusalCode.OFFSET, "w#r0c0 starts at offset 1000, expected 0", id="offset>0"),
    pytest.param(_move(1500), RefusalCode.OFFSET, "w#r0c0: chunk at offset 1500, expected 1000", id="gap"),
    pytest.param(_cut("w#r0c0", -1), RefusalCode.TRUNCATED, "w#r0c0 ended after 7000 bytes", id="truncated"),
    pytest.param(
        lambda f: f[: shard_frames(f, "w#r0c0")[-1]], RefusalCode.TRUNCATED, "w#r0c0 is incomplete", id="ends"
    ),
    pytest.param(_drop("w#r1c0"), RefusalCode.MISSING, "never arrived, e.g. w#r1c0", id="missing"),
    pytest.param(_tamper, RefusalCode.DIGEST, "w#r0c0: digest does not match the header", id="digest"),
    pytest.param(_twice, RefusalCode.DUPLICATE, "b#r0c0 sent twice", id="twice"),
    pytest.param(_unlisted, RefusalCode.UNKNOWN_SHARD, "x#r0c0 is not listed in the header", id="unlisted"),
    pytest.param(_relabel(dtype="<f4"), RefusalCode.DTYPE, "b#r0c0 has dtype <f4, the header says <f8", id="dtype"),
    pytest.param(_relabel(shape=[1, 30]), RefusalCode.SHAPE, r"b#r0c0 has shape \(1, 30\)", id="shape"),
    pytest.param(_header_twice, RefusalCode.PROTOCOL, "header sent twice in one forward", id="header-twice"),
    pytest.param(lambda f: f[1:], RefusalCode.PROTOCOL, "must start with its header", id="no-header"),
]


@pytest.mark.parametrize(("edit", "code", "match"), FORWARD_CASES)
def test_a_broken_forward_stream_is_refused_with_its_code_and_counts_nothing(
    reducer: tuple[ZoneAggregator, str], edit: Callable[[Frames], Frames], code: RefusalCode, match: str
) -> None:
    zone, endpoint = reducer
    a = sums(1)
    frames = edit(forward_frames(partial_from(a), a))

    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.ZoneStub(channel).Forward(iter(frames), timeout=20)

    error = info.value
    assert dict(error.trailing_metadata())[REFUSAL_CODE_KEY] == code.value
    assert error.code() == GRPC_STATUS[code]
    assert error.details().startswith("zone eu-1")
    assert re.search(match, error.details())
    assert "\n" not in error.details()
    assert zone.stats.partials_received == 0
    assert_only_good_forward_counted(zone, endpoint)


def test_a_refused_forward_reaches_the_client_with_its_code(reducer: tuple[ZoneAggregator, str]) -> None:
    zone, endpoint = reducer
    a = sums(1)
    partial = partial_from(a)
    a["b#r0c0"] = a["b#r0c0"] + 1.0

    with (
        GrpcZoneClient(endpoint, timeout=20, chunk_bytes=CHUNK) as client,
        pytest.raises(PushRejectedError, match="b#r0c0: digest does not match the header") as info,
    ):
        client.forward(partial, a)

    assert info.value.code is RefusalCode.DIGEST
    assert_only_good_forward_counted(zone, endpoint)


def test_a_malformed_forward_header_is_refused(reducer: tuple[ZoneAggregator, str]) -> None:
    zone, endpoint = reducer
    frames = [pb.PushFrame(header=pb.PushHeader(manifest=b"{not json", round_token=TOKEN))]

    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.ZoneStub(channel).Forward(iter(frames), timeout=20)

    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(info.value.trailing_metadata())[REFUSAL_CODE_KEY] == RefusalCode.MALFORMED.value
    assert_only_good_forward_counted(zone, endpoint)


# push: the same breaks, refused the same way ---------------------------------------------------


PUSH_CASES = [
    pytest.param(_cut("w#r0c0", 0), RefusalCode.OFFSET, "w#r0c0 starts at offset 1000, expected 0", id="offset>0"),
    pytest.param(_move(1500), RefusalCode.OFFSET, "w#r0c0: chunk at offset 1500, expected 1000", id="gap"),
    pytest.param(_cut("w#r0c0", -1), RefusalCode.TRUNCATED, "w#r0c0 ended after 3000 bytes", id="truncated"),
    pytest.param(_drop("w#r1c0"), RefusalCode.MISSING, "never arrived, e.g. w#r1c0", id="missing"),
    pytest.param(_tamper, RefusalCode.DIGEST, "w#r0c0: digest does not match the manifest", id="digest"),
    pytest.param(_twice, RefusalCode.DUPLICATE, "b#r0c0 sent twice", id="twice"),
    pytest.param(_unlisted, RefusalCode.UNKNOWN_SHARD, "x#r0c0 is not in the round's shard plan", id="unlisted"),
    pytest.param(_relabel(dtype="<f8"), RefusalCode.DTYPE, "b#r0c0 has dtype <f8, the plan says <f4", id="dtype"),
    pytest.param(_relabel(dtype="he", shape=[]), RefusalCode.DTYPE, "b#r0c0 has dtype he", id="he"),
    pytest.param(_relabel(shape=[1, 30]), RefusalCode.SHAPE, r"b#r0c0 has shape \(1, 30\)", id="shape"),
]


@pytest.mark.parametrize(("edit", "code", "match"), PUSH_CASES)
def test_a_broken_push_stream_is_refused_like_a_forward_and_counts_nothing(
    grpc_zone: tuple[ZoneAggregator, str], edit: Callable[[Frames], Frames], code: RefusalCode, match: str
) -> None:
    zone, endpoint = grpc_zone
    plan_values = {sid: v.astype(np.float32) for sid, v in sums(1).items()}
    manifest = manifest_for("site-a", plan_values, plan=PLAN, zone="eu-1")
    header = pb.PushFrame(header=pb.PushHeader(manifest=manifest.to_bytes(), round_token=TOKEN))
    frames = edit([header, *(pb.PushFrame(chunk=c) for c in chunks(plan_values, CHUNK))])
    with GrpcZoneClient(endpoint, timeout=20) as client:
        client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES))

    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.ZoneStub(channel).Push(iter(frames), timeout=20)

    error = info.value
    assert dict(error.trailing_metadata())[REFUSAL_CODE_KEY] == code.value
    assert error.code() == GRPC_STATUS[code]
    assert error.details().startswith("zone eu-1 refused site-a's push for round 1: ")
    assert re.search(match, error.details())
    assert zone.stats.pushes == 0 and zone.stats.refused == 1
    assert zone.close_round(1) == []  # nothing was counted


# fetch ----------------------------------------------------------------------------------------


class _Served(pb_grpc.ZoneServicer):
    """A zone that answers every fetch with the frames a test set."""

    def __init__(self) -> None:
        self.frames: list[pb.AggregateFrame] = []

    def FetchAggregate(
        self, request: pb.FetchAggregateRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.AggregateFrame]:
        yield from self.frames


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[_Served, str]]:
    servicer = _Served()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ZoneServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(timeout=10)


def aggregate_stream() -> tuple[AggregateSummary, Shards, list[pb.AggregateFrame]]:
    rng = np.random.default_rng(3)
    shards = {sid: rng.standard_normal(PLAN.shard(sid).shape).astype(np.float32) for sid in PLAN.shard_ids}
    entries = tuple(ShardEntry(sid, shard_digest(v), int(v.nbytes)) for sid, v in shards.items())
    summary = AggregateSummary("eu-1", 1, merkle_root({e.shard_id: e.digest for e in entries}), 2.0, SITES, entries)
    frames = [pb.AggregateFrame(header=summary_to_header(summary))]
    frames += [pb.AggregateFrame(chunk=c) for c in chunks(shards, CHUNK)]
    return summary, shards, frames


def fetch(served: tuple[_Served, str], frames: list[pb.AggregateFrame]) -> tuple[AggregateSummary, Shards]:
    served[0].frames = frames
    with GrpcZoneClient(served[1], timeout=20) as client:
        aggregate = client.fetch(1)
    assert not aggregate.ciphertexts
    return aggregate.summary, dict(aggregate.means)


def test_a_good_aggregate_stream_is_fetched(served: tuple[_Served, str]) -> None:
    summary, shards, frames = aggregate_stream()

    fetched, values = fetch(served, frames)

    assert fetched == summary and fetched.group == DEFAULT_GROUP
    for sid, v in shards.items():
        np.testing.assert_array_equal(values[sid], v)


def test_a_zone_writes_aggregate_frames_as_protobuf_would_and_keeps_only_small_ones_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    summary, shards, _ = aggregate_stream()
    want = [pb.AggregateFrame(header=summary_to_header(summary)), *(pb.AggregateFrame(chunk=c) for c in chunks(shards))]
    service = ZoneService(ZoneAggregator("eu-1", "EU"))
    aggregate = Aggregate(summary, shards)

    built = service._frames(aggregate)
    assert [pb.AggregateFrame.FromString(f) for f in built] == want
    assert service._frames(aggregate) is built  # every site of the round is served the same bytes

    monkeypatch.setattr(service_module, "SERVED_FRAMES_BYTES", aggregate.nbytes - 1)  # now too large to keep
    large = Aggregate(summary, shards)
    streamed = service._frames(large)
    assert not isinstance(streamed, list)  # written as the stream takes them
    assert [pb.AggregateFrame.FromString(f) for f in streamed] == want
    assert all(kept is not large for kept, _ in service._served.values())


FETCH_CASES = [
    pytest.param(_cut("w#r0c0", 0), RefusalCode.OFFSET, "w#r0c0 starts at offset 1000, expected 0", id="offset>0"),
    pytest.param(_move(1500), RefusalCode.OFFSET, "w#r0c0: chunk at offset 1500, expected 1000", id="gap"),
    pytest.param(_cut("w#r0c0", -1), RefusalCode.TRUNCATED, "w#r0c0 ended after 3000 bytes", id="truncated"),
    pytest.param(
        lambda f: f[: shard_frames(f, "w#r0c0")[-1]], RefusalCode.TRUNCATED, "w#r0c0 is incomplete", id="ends"
    ),
    pytest.param(
        _drop("w#r1c0"), RefusalCode.MISSING, "1 shard(s) of the summary never arrived, e.g. w#r1c0", id="missing"
    ),
    pytest.param(_tamper, RefusalCode.DIGEST, "w#r0c0: digest does not match the summary", id="digest"),
    pytest.param(_twice, RefusalCode.DUPLICATE, "b#r0c0 sent twice", id="twice"),
    pytest.param(_unlisted, RefusalCode.UNKNOWN_SHARD, "x#r0c0 is not listed in the summary", id="unlisted"),
    pytest.param(_relabel(dtype=">f4"), RefusalCode.DTYPE, "b#r0c0 has dtype >f4, not a little-endian", id="dtype"),
    pytest.param(
        _relabel(shape=[30, 2]), RefusalCode.SHAPE, "b#r0c0: dtype <f4 and shape (30, 2) make 240 bytes", id="shape"
    ),
    pytest.param(_relabel(dtype="<i4"), RefusalCode.DIGEST, "b#r0c0: digest does not match", id="reinterpreted"),
    pytest.param(_header_twice, RefusalCode.PROTOCOL, "a second header in the stream", id="header-twice"),
]


@pytest.mark.parametrize(("edit", "code", "match"), FETCH_CASES)
def test_a_broken_aggregate_stream_is_refused_with_its_code(
    served: tuple[_Served, str], edit: Callable[[list], list], code: RefusalCode, match: str
) -> None:
    _, _, frames = aggregate_stream()

    with pytest.raises(FrameError) as info:
        fetch(served, edit(frames))

    assert info.value.code is code
    assert str(info.value).startswith(f"aggregate {DEFAULT_GROUP} of round 1 from zone eu-1: ")
    assert match in str(info.value)
    assert "\n" not in str(info.value)


def test_an_aggregate_whose_shard_list_fails_its_root_is_refused(served: tuple[_Served, str]) -> None:
    _, _, frames = aggregate_stream()
    frames[0].header.merkle_root = "00" * 32

    with pytest.raises(IntegrityError, match="its shard list fails its Merkle root"):
        fetch(served, frames)


def test_a_stream_without_a_header_is_a_zone_error(served: tuple[_Served, str]) -> None:
    _, _, frames = aggregate_stream()

    with pytest.raises(ZoneError, match="sent no aggregate header for round 1"):
        fetch(served, frames[1:])


# ciphertexts over the wire ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def he(tmp_path_factory: pytest.TempPathFactory) -> tuple[HeCodec, object]:
    secret, public = he_init(tmp_path_factory.mktemp("he"))
    return HeCodec(load_context(secret, secret=True)), load_context(public, secret=False)


def test_ciphertexts_travel_as_bytes_labelled_ckks_in_many_chunks(he: tuple[HeCodec, object]) -> None:
    codec, public = he
    plan = ShardPlan.from_state_dict({"w": np.zeros((2, 3000), np.float32)}, tile=(2, 4096))
    (sid,) = plan.shard_ids
    zone = ZoneAggregator("eu-1", "EU", he_context=public)
    server, port = serve(zone, "127.0.0.1:0", max_workers=2)
    x = np.random.default_rng(0).normal(0, 0.1, (2, 3000))
    blob = {sid: codec.encrypt(x, 1.0)[0]}
    manifest = build_manifest(
        site_id="site-a", round=1, plan_digest=plan.digest, base_version=BASE, zone="eu-1", weight=1.0,
        shards=blob, encrypted=frozenset(blob),
    )  # fmt: skip
    try:
        with GrpcZoneClient(f"127.0.0.1:{port}", timeout=20, chunk_bytes=CHUNK) as client:
            client.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, SITES))
            client.push(manifest, TOKEN, blob)
            (summary,) = client.close_round(1)
            aggregate = client.fetch(1)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = list(pb_grpc.ZoneStub(channel).FetchAggregate(pb.FetchAggregateRequest(round=1), timeout=20))
    finally:
        server.stop(grace=None).wait(timeout=10)

    data = aggregate.ciphertexts[sid]
    assert type(data) is bytes and len(data) > 10 * CHUNK
    assert aggregate.summary == summary and summary.shards[0].encrypted
    assert stream[0].header.shards[0].encrypted
    assert (stream[1].chunk.dtype, list(stream[1].chunk.shape)) == (ENCRYPTED_DTYPE, [])
    assert len(stream) == 2 + len(data) // (1 << 20)  # the zone's own 1 MiB chunks
    np.testing.assert_allclose(codec.decrypt_mean(data, 6000).reshape(2, 3000), x, atol=codec.step)
    assert not hasattr(client, "fetch_aggregate")  # the one way to fetch: bytes, flagged by the summary


def test_an_encrypted_shard_labelled_as_values_is_refused(he: tuple[HeCodec, object]) -> None:
    codec, public = he
    plan = ShardPlan.from_state_dict({"w": np.zeros((2, 30), np.float32)})
    (sid,) = plan.shard_ids
    zone = ZoneAggregator("eu-1", "EU", he_context=public)
    zone.open_round(RoundSpec(1, TOKEN, plan.to_json(), BASE, SITES))
    blob = codec.encrypt(np.zeros(60), 1.0)[0]
    manifest = build_manifest(
        site_id="site-a", round=1, plan_digest=plan.digest, base_version=BASE, zone="eu-1", weight=1.0,
        shards={sid: blob}, encrypted=frozenset({sid}),
    )  # fmt: skip

    with zone.begin_push(manifest, TOKEN) as session, pytest.raises(PushRejectedError) as info:
        session.receive(sid, blob, offset=0, dtype="|u1", shape=(1, len(blob)))

    assert info.value.code is RefusalCode.DTYPE
    assert f"shard {sid} has dtype |u1, the manifest says he" in str(info.value)
    assert zone.close_round(1) == []


# protocol format: a zone refuses a header of a hash it does not speak ----------------------------


def _sha256_era(body: bytes) -> bytes:
    """``body`` as fedshard before BLAKE3 wrote it: manifest format 2, no ``hash`` field."""
    doc = json.loads(body)
    doc.pop("hash")
    if "format" in doc:
        doc["format"] = 2
    return json.dumps(doc).encode()


def test_a_push_with_a_manifest_of_the_sha256_era_is_refused_with_one_line(
    grpc_zone: tuple[ZoneAggregator, str],
) -> None:
    zone, endpoint = grpc_zone
    plan_values = {sid: v.astype(np.float32) for sid, v in sums(1).items()}
    manifest = manifest_for("site-a", plan_values, plan=PLAN, zone="eu-1")
    header = pb.PushFrame(header=pb.PushHeader(manifest=_sha256_era(manifest.to_bytes()), round_token=TOKEN))
    with GrpcZoneClient(endpoint, timeout=20) as client:
        client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES))

    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.ZoneStub(channel).Push(
            iter([header, *(pb.PushFrame(chunk=c) for c in chunks(plan_values, CHUNK))]), timeout=20
        )

    error = info.value
    assert dict(error.trailing_metadata())[REFUSAL_CODE_KEY] == RefusalCode.FORMAT.value
    assert error.code() == GRPC_STATUS[RefusalCode.FORMAT] == grpc.StatusCode.FAILED_PRECONDITION
    assert "manifest format 2 (SHA-256 digests" in error.details() and "\n" not in error.details()
    assert zone.stats.pushes == 0
    assert zone.close_round(1) == []  # nothing was counted


def test_a_forward_header_of_the_sha256_era_is_refused(reducer: tuple[ZoneAggregator, str]) -> None:
    zone, endpoint = reducer
    a = sums(1)
    frames = forward_frames(partial_from(a), a)
    old = frames[0].header.manifest
    frames[0] = pb.PushFrame(header=pb.PushHeader(manifest=_sha256_era(old), round_token=TOKEN))

    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.ZoneStub(channel).Forward(iter(frames), timeout=20)

    assert dict(info.value.trailing_metadata())[REFUSAL_CODE_KEY] == RefusalCode.FORMAT.value
    assert "unsupported digest hash 'sha256 (unnamed)' in a partial sum header" in info.value.details()
    assert_only_good_forward_counted(zone, endpoint)
