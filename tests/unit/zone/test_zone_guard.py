"""The zone's stream guard: per-party admission and the watchdog, on a fake clock and fake calls."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from fedshard.config import ZoneLimits
from fedshard.errors import RefusalCode, ZoneError
from fedshard.zone._calls import Call
from fedshard.zone.rpc._guard import COORDINATORS, RESERVE_WORKERS, STREAMS, StreamGuard, end_call, pool_size

LIMITS = ZoneLimits(streams_per_party=2, calls_per_party=3, idle_s=5, grace_s=10, min_rate_kib_s=1)


@dataclass
class Frame:
    size: int

    def ByteSize(self) -> int:
        return self.size


@dataclass
class FakeCall:
    cancelled: list[tuple[int, str]] = field(default_factory=list)

    def cancel(self, code: int, details: str) -> None:
        self.cancelled.append((code, details))


class FakeContext:
    """What the guard uses of a grpc ServicerContext."""

    def __init__(self, peer: str = "ipv4:127.0.0.1:5000", with_call: bool = True) -> None:
        self._peer = peer
        self.call = FakeCall()
        if with_call:
            self._rpc_event = SimpleNamespace(call=self.call)
        self.plain_cancels = 0

    def peer(self) -> str:
        return self._peer

    def cancel(self) -> None:
        self.plain_cancels += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def refusals() -> list[tuple[str, str, RefusalCode, str]]:
    return []


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def guard(refusals: list[Any], clock: Clock) -> StreamGuard:
    return StreamGuard("eu-1", LIMITS, lambda *r: refusals.append(r), clock=clock, watch=False)


def _waiting(guard: StreamGuard, party: str | None = "site:a") -> tuple[Any, FakeContext]:
    """A stream blocked reading its peer's next frame."""
    context = FakeContext()
    stream = guard.admit("push", context, party)  # type: ignore[arg-type]
    stream._wait()
    return stream, context


def test_a_party_holds_at_most_its_limit_and_the_next_stream_is_refused_and_recorded(
    guard: StreamGuard, refusals: list[Any]
) -> None:
    first = guard.admit("push", FakeContext(), "site:a")  # type: ignore[arg-type]
    guard.admit("fetch", FakeContext(), "site:a")  # type: ignore[arg-type]
    with pytest.raises(ZoneError, match="site:a already holds 2 streams") as info:
        guard.admit("push", FakeContext(), "site:a")  # type: ignore[arg-type]
    assert info.value.code is RefusalCode.LIMIT
    assert refusals == [("push", "site:a", RefusalCode.LIMIT, refusals[0][3])]
    guard.admit("push", FakeContext(), "site:b")  # type: ignore[arg-type]  # another party is not held back
    with first:
        pass
    assert guard.held("site:a") == 1
    guard.admit("push", FakeContext(), "site:a")  # type: ignore[arg-type]  # the slot came back
    assert guard.held("site:a") == 2 and guard.open_streams == 3


def test_unary_calls_have_their_own_allowance_beside_the_streams(guard: StreamGuard, refusals: list[Any]) -> None:
    for _ in range(LIMITS.streams_per_party):
        guard.admit(Call.PUSH, FakeContext(), "site:a")  # type: ignore[arg-type]
    calls = [guard.admit(call, FakeContext(), "site:a") for call in (Call.INFO, Call.OPEN, Call.CLOSE)]  # type: ignore[arg-type]
    with pytest.raises(ZoneError, match=r"site:a already holds 3 unary calls .*limits.calls_per_party") as info:
        guard.admit(Call.RECONFIGURE, FakeContext(), "site:a")  # type: ignore[arg-type]
    assert info.value.code is RefusalCode.LIMIT
    assert [(r[0], r[1], r[2]) for r in refusals] == [(Call.RECONFIGURE, "site:a", RefusalCode.LIMIT)]
    assert guard.held("site:a", Call.INFO) == 3 and guard.held("site:a") == LIMITS.streams_per_party
    with calls[0]:
        pass
    guard.admit(Call.INFO, FakeContext(), "site:a")  # type: ignore[arg-type]  # the slot came back
    assert {Call.PUSH, Call.FORWARD, Call.FETCH} == STREAMS


def test_a_unary_call_gets_its_request_or_is_ended_when_it_never_comes(
    guard: StreamGuard, clock: Clock, refusals: list[Any]
) -> None:
    served = guard.admit(Call.INFO, FakeContext(), "coordinator:c")  # type: ignore[arg-type]
    assert served.request(iter([Frame(3), Frame(4)])).size == 3
    with pytest.raises(ZoneError, match="the info call ended before its request") as info:
        guard.admit(Call.INFO, FakeContext(), "coordinator:c").request(iter([]))  # type: ignore[arg-type]
    assert info.value.code is RefusalCode.PROTOCOL and refusals == []  # the service records it

    context = FakeContext()
    held = guard.admit(Call.OPEN, context, "site:a")  # type: ignore[arg-type]

    def never() -> Iterator[Frame]:  # the request does not come before the watchdog fires
        clock.now += LIMITS.idle_s + 1
        guard.check()
        raise grpc.RpcError()  # what grpc's request iterator raises once the call is cancelled
        yield Frame(1)  # pragma: no cover

    with pytest.raises(ZoneError) as ended:
        held.request(never())
    assert ended.value.code is RefusalCode.IDLE
    [(code, details)] = context.call.cancelled
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0] and "open-round call of site:a sent nothing" in details
    assert [(r[0], r[1], r[2]) for r in refusals] == [(Call.OPEN, "site:a", RefusalCode.IDLE)]


def test_without_a_party_there_is_no_limit_and_the_peer_address_is_the_caller(guard: StreamGuard) -> None:
    streams = [guard.admit("push", FakeContext(), None) for _ in range(10)]  # type: ignore[arg-type]
    assert guard.open_streams == 10
    assert streams[0].caller == "ipv4:127.0.0.1:5000"


def test_a_stream_that_sent_nothing_for_idle_s_is_ended_with_idle_and_recorded(
    guard: StreamGuard, clock: Clock, refusals: list[Any]
) -> None:
    stream, context = _waiting(guard)
    clock.now += LIMITS.idle_s - 0.1
    assert guard.check() == []
    clock.now += 0.2
    assert guard.check() == [stream]
    [(code, details)] = context.call.cancelled
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert "push stream of site:a sent nothing for 5s" in details
    assert [(r[0], r[1], r[2]) for r in refusals] == [("push", "site:a", RefusalCode.IDLE)]
    assert guard.check() == [] and len(refusals) == 1  # ended once


def test_time_the_zone_spends_working_is_not_charged_to_the_peer(guard: StreamGuard, clock: Clock) -> None:
    context = FakeContext()
    stream = guard.admit("push", context, "site:a")  # type: ignore[arg-type]
    clock.now += 1000  # e.g. folding a large push, or waiting for staging bytes
    assert guard.check() == []
    stream._wait()
    clock.now += 1
    assert guard.check() == []
    assert context.call.cancelled == []


def test_a_stream_slower_than_min_rate_after_the_grace_is_ended(guard: StreamGuard, clock: Clock) -> None:
    slow, slow_context = _waiting(guard, "site:slow")
    steady, steady_context = _waiting(guard, "site:steady")
    for _ in range(6):  # 4 s of waiting per frame, below idle_s; 2 KiB moved vs 1 byte
        clock.now += 4
        guard.check()
        for stream, size in ((slow, 1), (steady, 4 << 10)):
            if stream.ended is None:
                stream._resume()
                stream.moved += size
                stream._wait()
    assert slow.ended is not None and "moved 2 bytes in 12s of waiting" in slow.ended
    assert slow_context.call.cancelled and not steady_context.call.cancelled
    assert steady.ended is None


def test_frames_raise_idle_once_the_watchdog_ended_the_stream_and_drop_what_came_after(
    guard: StreamGuard, clock: Clock
) -> None:
    context = FakeContext()
    stream = guard.admit("push", context, "site:a")  # type: ignore[arg-type]

    def peer() -> Iterator[Frame]:
        yield Frame(10)
        clock.now += LIMITS.idle_s + 1
        guard.check()  # the watchdog fires while the handler waits
        yield Frame(20)  # arrived as the stream was ended: dropped

    frames = stream.frames(peer())
    assert next(frames).size == 10
    with pytest.raises(ZoneError) as info:
        next(frames)
    assert info.value.code is RefusalCode.IDLE
    assert stream.moved == 10


def test_a_read_failing_after_the_end_raises_idle_not_the_grpc_error(guard: StreamGuard, clock: Clock) -> None:
    context = FakeContext()
    stream = guard.admit("push", context, "site:a")  # type: ignore[arg-type]

    class Cancelled:
        def __iter__(self) -> Cancelled:
            return self

        def __next__(self) -> Frame:
            clock.now += LIMITS.idle_s + 1
            guard.check()
            raise grpc.RpcError()  # what grpc's request iterator raises once the call is cancelled

    with pytest.raises(ZoneError) as info:
        next(stream.frames(Cancelled()))
    assert info.value.code is RefusalCode.IDLE


def test_replies_charge_the_time_until_the_peer_takes_each_frame(guard: StreamGuard, clock: Clock) -> None:
    context = FakeContext()
    stream = guard.admit("fetch", context, "site:a")  # type: ignore[arg-type]
    replies = stream.replies(iter([Frame(5), Frame(7)]))
    assert next(replies).size == 5
    clock.now += LIMITS.idle_s + 1  # the peer does not read
    assert guard.check() == [stream]
    with pytest.raises(ZoneError):
        next(replies)


def test_end_call_falls_back_to_a_plain_cancel() -> None:
    context = FakeContext(with_call=False)
    end_call(context, RefusalCode.IDLE, "idle")  # type: ignore[arg-type]
    assert context.plain_cancels == 1


def test_the_pool_holds_every_partys_allowance_plus_a_reserve() -> None:
    assert COORDINATORS == 1
    assert pool_size(LIMITS, 10) == 10 * (2 + 3) + 3 + RESERVE_WORKERS
    assert pool_size(ZoneLimits(workers=8), 10) == 8


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="streams_per_party"):
        ZoneLimits(streams_per_party=0)
    with pytest.raises(ValueError, match="calls_per_party"):
        ZoneLimits(calls_per_party=0)
    with pytest.raises(ValueError, match="connection_age_s"):
        ZoneLimits(connection_age_s=1)
    with pytest.raises(ValueError, match="idle_s"):
        ZoneLimits(idle_s=0)
    with pytest.raises(ValueError, match="extra"):
        ZoneLimits(idle=3)  # type: ignore[call-arg]
