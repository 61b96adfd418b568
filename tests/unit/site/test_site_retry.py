"""A site retries zone calls that got no answer (:mod:`fedshard.site._retry`), never a refusal;
a retried push the zone holds counts as pushed only if it holds that very manifest."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Mapping

import numpy as np
import pytest

from fedshard.errors import HeldPush, PushRejectedError, RefusalCode, RoundError, ZoneUnavailableError
from fedshard.integrity import Manifest
from fedshard.protocol.messages import ZonePush
from fedshard.protocol.rounds import PushReceipt, ShardPayload
from fedshard.residency.router import RouteDecision
from fedshard.site._release import push_update
from fedshard.site._retry import Retry, held_push
from fedshard.site.routes import SiteRouting
from fedshard.zone.rpc.client import GrpcZoneClient
from tests.zone_helpers import train_instruction


class _Clock:
    """A clock the retries advance by sleeping (no real time passes)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _failing(times: int, then: object = "ok") -> tuple[list[int], Callable[[int], object]]:
    calls: list[int] = []

    def attempt(n: int) -> object:
        calls.append(n)
        if n <= times:
            raise ZoneUnavailableError("zone at x is unreachable")
        if isinstance(then, Exception):
            raise then
        return then

    return calls, attempt


def test_no_answer_is_retried_with_growing_jittered_waits_until_it_answers() -> None:
    clock, policy = _Clock(), Retry(first=0.5, factor=2.0, cap=3.0, jitter=0.5)
    calls, attempt = _failing(4)
    assert policy.call(attempt, deadline=100.0, what="push", clock=clock.time, sleep=clock.sleep) == "ok"
    assert calls == [1, 2, 3, 4, 5]
    caps = [0.5, 1.0, 2.0, 3.0]
    assert all(c * 0.5 <= s <= c for s, c in zip(clock.sleeps, caps, strict=True))


def test_a_refusal_is_an_answer_and_is_not_retried() -> None:
    clock = _Clock()
    calls, attempt = _failing(1, PushRejectedError("digest differs", RefusalCode.DIGEST))
    with pytest.raises(PushRejectedError, match="digest"):
        Retry().call(attempt, deadline=100.0, what="push", clock=clock.time, sleep=clock.sleep)
    assert calls == [1, 2]


@pytest.mark.parametrize(("deadline", "patience"), [(5.0, 1000.0), (1000.0, 5.0)])
def test_retries_stop_at_the_deadline_or_the_patience(deadline: float, patience: float) -> None:
    clock = _Clock()
    calls, attempt = _failing(10**6)
    with pytest.raises(ZoneUnavailableError, match=r"gave up after \d+ attempts"):
        Retry(first=1.0, factor=1.0, jitter=0.0, patience=patience).call(
            attempt, deadline=deadline, what="push", clock=clock.time, sleep=clock.sleep
        )
    assert clock.now < 5.0 and len(calls) == 5  # attempts at 0, 1, 2, 3, 4; the next would start at 5


def test_waits_are_spread_by_jitter() -> None:
    rng = random.Random(1)
    waits = {round(Retry(first=1.0, jitter=0.5).wait(1, rng), 6) for _ in range(20)}
    assert len(waits) > 10 and all(0.5 <= w <= 1.0 for w in waits)


def test_only_a_retry_trusts_what_the_zone_says_it_holds() -> None:
    duplicate = PushRejectedError("already pushed", RefusalCode.DUPLICATE)
    duplicate.held = HeldPush.COUNTED
    assert held_push(duplicate, 1) is None
    assert held_push(duplicate, 2) is HeldPush.COUNTED
    other = PushRejectedError("stale", RefusalCode.TOKEN)
    other.held = HeldPush.COUNTED  # never sent with another code; ignored if it were
    assert held_push(other, 2) is None


def test_a_closed_port_is_no_answer() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with GrpcZoneClient(f"127.0.0.1:{port}", timeout=5) as client, pytest.raises(ZoneUnavailableError):
        client.info()


class _Flaky:
    """A zone that drops the first attempt's answer, then answers the retry with ``second``."""

    def __init__(self, second: PushRejectedError | None) -> None:
        self.second, self.attempts, self.closed = second, 0, 0

    def connect(self, zone: str, endpoint: str) -> _Flaky:
        return self

    def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
        self.attempts += 1
        if self.attempts == 1:
            raise ZoneUnavailableError("zone at x did not answer in time")
        if self.second is not None:
            raise self.second
        return PushReceipt("zone-a", 1, manifest.site_id, len(shards), 16)

    def close(self) -> None:
        self.closed += 1


def _push(zone: _Flaky) -> list[ZonePush]:
    payload = {"s0": np.zeros(4, np.float32)}
    routing = SiteRouting({"s0": RouteDecision("s0", "public", "test", "test", ["*"], "zone-a")}, "policy")
    message = train_instruction(("zone-a",))
    return push_update(
        payload,
        routing,
        message,
        dict(message.zones),
        site_id="site-1",
        plan_digest="plan",
        weight=1.0,
        signing_key=None,
        connect=zone.connect,  # type: ignore[arg-type]
    )


def _duplicate(held: HeldPush | None) -> PushRejectedError:
    error = PushRejectedError("zone zone-a refused site-1's push for round 1: already pushed", RefusalCode.DUPLICATE)
    error.held = held
    return error


def test_a_retried_push_the_zone_counted_is_a_success() -> None:
    zone = _Flaky(_duplicate(HeldPush.COUNTED))
    [push] = _push(zone)
    assert (push.zone, push.shards, zone.attempts, zone.closed) == ("zone-a", 1, 2, 2)


def test_a_retried_push_refused_as_another_manifest_is_a_failure() -> None:
    zone = _Flaky(_duplicate(None))
    with pytest.raises(RoundError, match="already pushed") as info:
        _push(zone)
    assert info.value.code is RefusalCode.DUPLICATE and zone.attempts == 2
