"""A zone over real gRPC on loopback: rounds end to end, refused pushes, error mapping.

Every refused push must come back as one line naming the shard or the reason, with a
status code that says what kind of refusal it was, and leave nothing counted: each
refusal test ends with :func:`assert_only_good_counted`.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest

from fedshard.errors import AggregateNotFoundError, PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import Manifest, merkle_root, shard_digest
from fedshard.protocol.rounds import RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc import zone_pb2 as pb
from fedshard.zone.rpc import zone_pb2_grpc
from fedshard.zone.rpc._status import REFUSAL_CODE_KEY
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.convert import chunks
from tests import zone_helpers
from tests.zone_helpers import BASE, TOKEN, Shards, assert_weighted_mean, random_update

SITES = ("site-a", "site-b", "site-c", "site-d")
GOOD_SITE = "site-d"
CHUNK = 1000

# w (40, 30) -> w#r0c0 (32, 30) = 3840 bytes, 4 chunks of at most 1000; w#r1c0 (8, 30) = 960
# bytes; b (30,) -> b#r0c0 (30, 1) = 120 bytes.
PLAN = ShardPlan.from_state_dict({"w": np.zeros((40, 30), np.float32), "b": np.zeros(30, np.float32)}, tile=(32, 32))


def make_update(seed: int, plan: ShardPlan = PLAN) -> Shards:
    return random_update(seed, plan)


WEIGHTS = {"site-a": 1.0, "site-b": 3.0, "site-c": 5.0, GOOD_SITE: 2.0}  # what the rounds fix for each site


def manifest_for(site: str, shards: Shards, **kwargs: Any) -> Manifest:
    """``site``'s manifest for ``shards`` at eu-1, with the weight the rounds fix for it unless told."""
    kwargs.setdefault("weight", WEIGHTS.get(site, 1.0))
    kwargs.setdefault("plan", PLAN)
    kwargs.setdefault("zone", "eu-1")
    return zone_helpers.manifest_for(site, shards, **kwargs)


def round_spec(plan: ShardPlan = PLAN) -> RoundSpec:
    return RoundSpec(1, TOKEN, plan.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items()))


@pytest.fixture
def client(zone_client: GrpcZoneClient) -> GrpcZoneClient:
    """Client of a zone with round 1 open."""
    zone_client.open_round(round_spec())
    return zone_client


def assert_only_good_counted(client: GrpcZoneClient) -> None:
    """Have GOOD_SITE push, close round 1, and check the aggregate is its update (within the stated bound)."""
    good = make_update(seed=99)
    client.push(manifest_for(GOOD_SITE, good, weight=2.0), TOKEN, good)
    summary = client.close_round(1)[0]
    got = client.fetch(1)
    fetched, aggregate = got.summary, got.means

    assert summary.sites == (GOOD_SITE,)
    assert summary.total_weight == 2.0
    assert fetched == summary
    assert set(aggregate) == set(PLAN.shard_ids)
    for shard_id, values in good.items():
        assert_weighted_mean(aggregate[shard_id], [values], [2.0])


def header(manifest: Manifest, token: str = TOKEN) -> pb.PushFrame:
    return pb.PushFrame(header=pb.PushHeader(manifest=manifest.to_bytes(), round_token=token))


def chunk_frames(shards: Shards) -> list[pb.PushFrame]:
    return [pb.PushFrame(chunk=c) for c in chunks(shards, CHUNK)]


def raw_push(stub: zone_pb2_grpc.ZoneStub, frames: list[pb.PushFrame]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stub.Push(iter(frames), timeout=20)
    error = info.value
    assert isinstance(error, grpc.Call)
    assert "\n" not in (error.details() or "")
    return error  # type: ignore[return-value]


# end to end ---------------------------------------------------------------------------------


def test_info_names_the_zone(zone_client: GrpcZoneClient) -> None:
    zone_client.wait_ready(timeout=20)

    assert zone_client.info() == ("eu-1", "EU")


def test_round_end_to_end_with_chunked_shards(grpc_zone: tuple[ZoneAggregator, str], client: GrpcZoneClient) -> None:
    a, b = make_update(1), make_update(2)

    receipt = client.push(manifest_for("site-a", a, weight=1.0), TOKEN, a)
    client.push(manifest_for("site-b", b, weight=3.0), TOKEN, b)
    summary = client.close_round(1)[0]
    got = client.fetch(1)
    fetched, aggregate = got.summary, got.means

    assert (receipt.zone, receipt.round, receipt.site_id) == ("eu-1", 1, "site-a")
    assert (receipt.shards, receipt.bytes) == (3, PLAN.nbytes)
    assert summary.sites == ("site-a", "site-b")
    assert summary.total_weight == 4.0
    assert fetched == summary
    assert summary == grpc_zone[0].fetch(1).summary
    assert summary.merkle_root == merkle_root({sid: shard_digest(v) for sid, v in aggregate.items()})
    for sid in PLAN.shard_ids:
        assert aggregate[sid].dtype == np.float32
        assert aggregate[sid].shape == PLAN.shard(sid).shape
        assert_weighted_mean(aggregate[sid], [a[sid], b[sid]], [1.0, 3.0])


def test_concurrent_pushes_are_all_counted(client: GrpcZoneClient) -> None:
    updates = {site: make_update(i) for i, site in enumerate(SITES)}
    weights = WEIGHTS

    with ThreadPoolExecutor(max_workers=len(SITES)) as pool:
        receipts = list(
            pool.map(
                lambda site: client.push(manifest_for(site, updates[site], weight=weights[site]), TOKEN, updates[site]),
                SITES,
            )
        )
    summary = client.close_round(1)[0]
    aggregate = client.fetch(1).means

    assert sorted(r.site_id for r in receipts) == sorted(SITES)
    assert sorted(summary.sites) == sorted(SITES)
    assert summary.total_weight == sum(weights.values())
    for sid in PLAN.shard_ids:
        assert_weighted_mean(aggregate[sid], [updates[s][sid] for s in SITES], [weights[s] for s in SITES])


def test_shard_larger_than_a_grpc_chunk_round_trips(grpc_zone: tuple[ZoneAggregator, str]) -> None:
    # 300 x 1000 float32 = 1.2 MB: over the zone's 1 MiB one-chunk limit and the server's
    # 1 MiB chunks for aggregates, so both reassembly paths run.
    plan = ShardPlan.from_state_dict({"big": np.zeros((300, 1000), np.float32)}, tile=(512, 1024))
    update = make_update(3, plan)
    with GrpcZoneClient(grpc_zone[1], timeout=20, chunk_bytes=256 << 10) as client:
        client.open_round(round_spec(plan))
        client.push(manifest_for("site-a", update, plan=plan), TOKEN, update)
        client.close_round(1)[0]
        aggregate = client.fetch(1).means

    assert_weighted_mean(aggregate["big#r0c0"], [update["big#r0c0"]], [1.0])


def test_zero_size_shard_round_trips(client: GrpcZoneClient) -> None:
    plan = ShardPlan.from_state_dict({"empty": np.zeros((0, 3), np.float32), "w": np.zeros((2, 2), np.float32)})
    update = plan.split({"empty": np.zeros((0, 3), np.float32), "w": np.full((2, 2), 0.5, np.float32)})
    client.open_round(RoundSpec(2, TOKEN, plan.to_json(), BASE, SITES, weights=tuple(WEIGHTS.items())))

    client.push(manifest_for("site-a", update, round=2, plan=plan), TOKEN, update)
    client.close_round(2)[0]
    aggregate = client.fetch(2).means

    assert aggregate["empty#r0c0"].shape == (0, 3)
    assert_weighted_mean(aggregate["w#r0c0"], [update["w#r0c0"]], [1.0])


# refused pushes through the client ------------------------------------------------------------

Case = Callable[[], tuple[Manifest, str, Shards]]


def _digest_tampered() -> tuple[Manifest, str, Shards]:
    a = make_update(1)
    manifest = manifest_for("site-a", a)
    a["w#r0c0"] = a["w#r0c0"].copy()
    a["w#r0c0"][31, 29] += 1.0  # in the last 1000-byte chunk
    return manifest, TOKEN, a


def _relabelled(shard_id: str, change: Callable[[np.ndarray], np.ndarray]) -> Case:
    """The manifest lists the real shard; the push sends ``change(shard)`` instead."""

    def case() -> tuple[Manifest, str, Shards]:
        a = make_update(1)
        manifest = manifest_for("site-a", a)
        a[shard_id] = change(a[shard_id])
        return manifest, TOKEN, a

    return case


def _with_bad_value(bad: float) -> Case:
    def case() -> tuple[Manifest, str, Shards]:
        a = make_update(1)
        a["w#r0c0"][20, 3] = bad
        return manifest_for("site-a", a), TOKEN, a

    return case


def _manifest_case(site: str = "site-a", **kwargs: object) -> Case:
    def case() -> tuple[Manifest, str, Shards]:
        a = make_update(1)
        return manifest_for(site, a, **kwargs), TOKEN, a  # type: ignore[arg-type]

    return case


def _wrong_token() -> tuple[Manifest, str, Shards]:
    a = make_update(1)
    return manifest_for("site-a", a), "stale-token", a


def _unknown_shard() -> tuple[Manifest, str, Shards]:
    a = make_update(1)
    a["w#r9c9"] = np.zeros((2, 2), np.float32)
    return manifest_for("site-a", a), TOKEN, a


def _unlisted_shard() -> tuple[Manifest, str, Shards]:
    a = make_update(1)
    return manifest_for("site-a", {k: v for k, v in a.items() if k != "b#r0c0"}), TOKEN, a


OTHER_PLAN = ShardPlan.from_state_dict({"w": np.zeros((40, 30), np.float32), "b": np.zeros(30, np.float32)})

CLIENT_CASES = [
    pytest.param(_wrong_token, RefusalCode.TOKEN, "FAILED_PRECONDITION", "round token does not match", id="token"),
    pytest.param(
        _manifest_case(site="site-z"), RefusalCode.SITE, "FAILED_PRECONDITION", "site-z.* not selected", id="site"
    ),
    pytest.param(
        _manifest_case(round=9), RefusalCode.ROUND, "FAILED_PRECONDITION", "round 9: round is not open", id="round"
    ),
    pytest.param(
        _manifest_case(plan=OTHER_PLAN), RefusalCode.PLAN, "FAILED_PRECONDITION", "shard plan differs", id="plan"
    ),
    pytest.param(
        _manifest_case(base="cd" * 32),
        RefusalCode.VERSION,
        "FAILED_PRECONDITION",
        "version cdcdcdcdcdcd…",
        id="version",
    ),
    pytest.param(
        _manifest_case(zone="us-1"), RefusalCode.ZONE, "FAILED_PRECONDITION", "addressed to zone 'us-1'", id="zone"
    ),
    pytest.param(
        _unknown_shard,
        RefusalCode.UNKNOWN_SHARD,
        "INVALID_ARGUMENT",
        "w#r9c9 is not in the round's shard plan",
        id="unknown-shard",
    ),
    pytest.param(
        _unlisted_shard,
        RefusalCode.UNKNOWN_SHARD,
        "INVALID_ARGUMENT",
        "b#r0c0 is not listed in the manifest",
        id="unlisted-shard",
    ),
    pytest.param(
        _digest_tampered, RefusalCode.DIGEST, "INVALID_ARGUMENT", "w#r0c0: digest does not match", id="digest"
    ),
    pytest.param(
        _relabelled("w#r1c0", lambda v: v.astype(np.float64)),
        RefusalCode.DTYPE,
        "INVALID_ARGUMENT",
        "w#r1c0 has dtype <f8",
        id="dtype",
    ),
    pytest.param(
        _relabelled("w#r1c0", lambda v: v.reshape(30, 8)),
        RefusalCode.SHAPE,
        "INVALID_ARGUMENT",
        r"w#r1c0 has shape \(30, 8\)",
        id="shape",
    ),
    pytest.param(
        _with_bad_value(np.nan), RefusalCode.NON_FINITE, "INVALID_ARGUMENT", "w#r0c0 contains NaN or infinite", id="nan"
    ),
    pytest.param(
        _with_bad_value(np.inf), RefusalCode.NON_FINITE, "INVALID_ARGUMENT", "w#r0c0 contains NaN or infinite", id="inf"
    ),
]


@pytest.mark.parametrize(("case", "code", "status", "match"), CLIENT_CASES)
def test_refused_push_is_one_line_with_its_code_and_status_and_counts_nothing(
    client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub, case: Case, code: RefusalCode, status: str, match: str
) -> None:
    manifest, token, shards = case()

    with pytest.raises(PushRejectedError, match=match) as info:
        client.push(manifest, token, shards)
    error = raw_push(zone_stub, [header(manifest, token), *chunk_frames(shards)])

    assert info.value.code is code
    assert str(info.value).startswith("zone eu-1 refused ")
    assert "\n" not in str(info.value)
    assert error.code().name == status
    assert dict(error.trailing_metadata())[REFUSAL_CODE_KEY] == code.value
    assert_only_good_counted(client)


def test_second_push_of_a_site_is_already_exists(client: GrpcZoneClient) -> None:
    first, second = make_update(1), make_update(2)
    client.push(manifest_for("site-a", first, weight=1.0), TOKEN, first)

    with pytest.raises(PushRejectedError, match="refused site-a's push for round 1: site already pushed") as info:
        client.push(manifest_for("site-a", second, weight=9.0), TOKEN, second)

    assert info.value.code is RefusalCode.DUPLICATE
    summary = client.close_round(1)[0]
    aggregate = client.fetch(1).means
    assert summary.sites == ("site-a",)
    assert summary.total_weight == 1.0
    for sid, values in first.items():
        assert_weighted_mean(aggregate[sid], [values], [1.0])


def test_push_to_an_aborted_round_is_refused(client: GrpcZoneClient) -> None:
    client.abort_round(1)
    a = make_update(1)

    with pytest.raises(PushRejectedError, match="round is not open") as info:
        client.push(manifest_for("site-a", a), TOKEN, a)

    assert info.value.code is RefusalCode.ROUND


# refused pushes, frame by frame ---------------------------------------------------------------


def _frames(site: str = "site-a", token: str = TOKEN) -> tuple[Manifest, list[pb.PushFrame]]:
    a = make_update(1)
    manifest = manifest_for(site, a)
    return manifest, [header(manifest, token), *chunk_frames(a)]


def _shard_frames(frames: list[pb.PushFrame], shard_id: str) -> list[int]:
    return [i for i, f in enumerate(frames) if f.WhichOneof("frame") == "chunk" and f.chunk.shard_id == shard_id]


def test_hand_made_frames_are_accepted(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    assert len(_shard_frames(frames, "w#r0c0")) == 4

    reply = zone_stub.Push(iter(frames), timeout=20)

    assert (reply.site_id, reply.shards, reply.bytes) == ("site-a", 3, PLAN.nbytes)
    assert client.close_round(1)[0].sites == ("site-a",)


def test_push_starting_with_a_chunk_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()

    error = raw_push(zone_stub, frames[1:])

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must start with its manifest" in error.details()
    assert_only_good_counted(client)


def test_empty_push_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    error = raw_push(zone_stub, [])

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must start with its manifest" in error.details()
    assert_only_good_counted(client)


def test_garbage_manifest_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    frames[0] = pb.PushFrame(header=pb.PushHeader(manifest=b"\x00not json", round_token=TOKEN))

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed manifest" in error.details()
    assert_only_good_counted(client)


def test_a_manifest_with_a_number_too_large_is_a_counted_malformed_refusal(
    client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub, grpc_zone: tuple[ZoneAggregator, str]
) -> None:
    """Issue 32, item 12: ``nbytes`` 1e999 came back UNKNOWN with exception text, uncounted."""
    manifest, frames = _frames()
    body = json.loads(manifest.to_bytes())
    body["shards"][0][2] = "HUGE"  # nbytes
    huge = json.dumps(body).encode().replace(b'"HUGE"', b"1e999")
    frames[0] = pb.PushFrame(header=pb.PushHeader(manifest=huge, round_token=TOKEN))
    refused = grpc_zone[0].stats.refused

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(error.trailing_metadata())[REFUSAL_CODE_KEY] == RefusalCode.MALFORMED.value
    assert "malformed manifest" in error.details() and "infinity" in error.details()
    assert grpc_zone[0].stats.refused == refused + 1
    assert_only_good_counted(client)


def test_manifest_sent_twice_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    frames.insert(2, frames[0])

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "manifest sent twice" in error.details()
    assert_only_good_counted(client)


def test_wrong_token_frame_is_failed_precondition(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames(token="replayed")

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "round token does not match" in error.details()
    assert_only_good_counted(client)


def test_chunk_at_wrong_offset_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    second = _shard_frames(frames, "w#r0c0")[1]
    frames[second].chunk.offset = 1500

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shard w#r0c0: chunk at offset 1500, expected 1000" in error.details()
    assert_only_good_counted(client)


def test_duplicated_chunk_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    second = _shard_frames(frames, "w#r0c0")[1]
    frames.insert(second + 1, frames[second])

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shard w#r0c0: chunk at offset 1000, expected 2000" in error.details()
    assert_only_good_counted(client)


def test_duplicated_shard_is_already_exists(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    (only,) = _shard_frames(frames, "b#r0c0")
    frames.append(frames[only])

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "shard b#r0c0 sent twice" in error.details()
    assert_only_good_counted(client)


def test_stream_ending_inside_a_shard_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    last = _shard_frames(frames, "w#r0c0")[-1]
    frames = [*frames[:last], *frames[last + 1 :]]
    frames = [f for f in frames if not (f.WhichOneof("frame") == "chunk" and f.chunk.shard_id != "w#r0c0")]

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shard w#r0c0 is incomplete" in error.details()
    assert_only_good_counted(client)


def test_next_shard_before_the_last_one_ended_is_refused(
    client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub
) -> None:
    _, frames = _frames()
    last = _shard_frames(frames, "w#r0c0")[-1]
    del frames[last]

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shard w#r0c0 ended after 3000 bytes" in error.details()
    assert_only_good_counted(client)


def test_stream_missing_a_shard_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    (only,) = _shard_frames(frames, "w#r1c0")
    del frames[only]

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "never arrived, e.g. w#r1c0" in error.details()
    assert_only_good_counted(client)


def test_first_chunk_without_dtype_is_refused(client: GrpcZoneClient, zone_stub: zone_pb2_grpc.ZoneStub) -> None:
    _, frames = _frames()
    first = _shard_frames(frames, "w#r0c0")[0]
    frames[first].chunk.dtype = ""

    error = raw_push(zone_stub, frames)

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shard w#r0c0 has dtype ?, the plan says <f4" in error.details()
    assert_only_good_counted(client)


# other errors ----------------------------------------------------------------------------------


def test_fetch_of_an_unknown_round_is_a_clear_zone_error(client: GrpcZoneClient) -> None:
    with pytest.raises(AggregateNotFoundError, match="zone eu-1: no regional/any aggregate for round 42") as info:
        client.fetch(42)

    assert "\n" not in str(info.value)
    assert info.value.code is RefusalCode.NOT_FOUND


def test_close_of_an_unknown_round_is_a_zone_error(client: GrpcZoneClient) -> None:
    with pytest.raises(ZoneError, match="round 8 is not open") as info:
        client.close_round(8)[0]

    assert not isinstance(info.value, PushRejectedError)
    assert info.value.code is RefusalCode.LIFECYCLE


def test_opening_a_round_twice_is_refused(client: GrpcZoneClient) -> None:
    with pytest.raises(ZoneError, match="round 1 was already opened") as info:
        client.open_round(round_spec())

    assert not isinstance(info.value, PushRejectedError)
    assert info.value.code is RefusalCode.LIFECYCLE


def test_digest_refusal_reaches_the_client_as_code_digest_with_the_zones_line(client: GrpcZoneClient) -> None:
    manifest, token, shards = _digest_tampered()

    with pytest.raises(PushRejectedError) as info:
        client.push(manifest, token, shards)

    assert info.value.code is RefusalCode.DIGEST
    assert (
        str(info.value)
        == "zone eu-1 refused site-a's push for round 1: shard w#r0c0: digest does not match the manifest"
    )
    assert_only_good_counted(client)


def test_closed_port_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    a = make_update(1)

    with GrpcZoneClient(f"127.0.0.1:{port}", timeout=2) as client:
        with pytest.raises(ZoneError, match=f"zone at 127.0.0.1:{port} is unreachable") as info:
            client.info()
        assert not isinstance(info.value, PushRejectedError)
        with pytest.raises(ZoneError, match="unreachable"):
            client.push(manifest_for("site-a", a), TOKEN, a)
