"""A site's pushes to its zones (``fedshard.site._release.push_update``): in parallel, errors per zone."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import pytest

from fedshard.errors import PushRejectedError, RefusalCode, RoundError
from fedshard.integrity import Manifest
from fedshard.protocol.messages import TrainInstruction
from fedshard.protocol.rounds import PushReceipt, ShardPayload
from fedshard.residency.router import RouteDecision
from fedshard.site._release import push_update
from fedshard.site.routes import SiteRouting
from tests.zone_helpers import train_instruction

ZONES = ("zone-a", "zone-b", "zone-c")
PAYLOAD = {f"s{i}": np.full(4, float(i), dtype=np.float32) for i in range(6)}


def _routing() -> SiteRouting:
    routes = {
        sid: RouteDecision(sid, "public", "test", "test", ["*"], ZONES[i % len(ZONES)]) for i, sid in enumerate(PAYLOAD)
    }
    return SiteRouting(routes, "policy")


def _message(zones: tuple[str, ...] = ZONES) -> TrainInstruction:
    return train_instruction(zones)


class _Zones:
    """Fake zone clients: each push waits at ``barrier`` (if any), then answers or refuses."""

    def __init__(self, barrier: threading.Barrier | None = None, refuse: Mapping[str, RefusalCode] = {}) -> None:
        self.barrier, self.refuse = barrier, dict(refuse)
        self.pushed: dict[str, list[str]] = {}
        self.closed: list[str] = []
        self.lock = threading.Lock()

    def connect(self, zone: str, endpoint: str) -> _Zones.Client:
        return _Zones.Client(self, zone)

    class Client:
        def __init__(self, zones: _Zones, zone: str) -> None:
            self.zones, self.zone = zones, zone

        def push(self, manifest: Manifest, token: str, shards: Mapping[str, ShardPayload]) -> PushReceipt:
            if self.zones.barrier is not None:
                self.zones.barrier.wait()  # every zone's push is in flight at once, or this breaks
            with self.zones.lock:
                self.zones.pushed[self.zone] = list(shards)
            if self.zone in self.zones.refuse:
                raise PushRejectedError(f"zone {self.zone} refuses", code=self.zones.refuse[self.zone])
            return PushReceipt(self.zone, 1, manifest.site_id, len(shards), 16 * len(shards))

        def close(self) -> None:
            with self.zones.lock:
                self.zones.closed.append(self.zone)


def _push(zones: _Zones, message: TrainInstruction | None = None, max_parallel: int = 4) -> list:
    message = message or _message()
    return push_update(
        PAYLOAD,
        _routing(),
        message,
        dict(message.zones),
        site_id="site-1",
        plan_digest="plan",
        weight=1.0,
        signing_key=None,
        connect=zones.connect,  # type: ignore[arg-type]
        max_parallel=max_parallel,
    )


def test_zones_are_pushed_at_once_and_acknowledged_in_zone_order() -> None:
    # a deadlock guard, not a time limit: sequential pushes would never pass the barrier
    zones = _Zones(barrier=threading.Barrier(len(ZONES), timeout=120))
    pushes = _push(zones)
    assert [p.zone for p in pushes] == list(ZONES)
    assert zones.pushed == {"zone-a": ["s0", "s3"], "zone-b": ["s1", "s4"], "zone-c": ["s2", "s5"]}
    assert sorted(zones.closed) == list(ZONES)


def test_one_at_a_time_when_asked() -> None:
    zones = _Zones()
    assert [p.zone for p in _push(zones, max_parallel=1)] == list(ZONES)


def test_a_refusal_is_reported_with_its_zone_code_and_the_other_zones_still_pushed() -> None:
    zones = _Zones(refuse={"zone-b": RefusalCode.DIGEST})
    with pytest.raises(RoundError, match="zone zone-b refuses") as info:
        _push(zones)
    assert info.value.code == RefusalCode.DIGEST
    assert set(zones.pushed) == set(ZONES) and sorted(zones.closed) == list(ZONES)


def test_of_several_refusals_the_first_zone_in_order_is_reported() -> None:
    zones = _Zones(refuse={"zone-c": RefusalCode.SHAPE, "zone-b": RefusalCode.DIGEST})
    with pytest.raises(RoundError, match="zone zone-b refuses") as info:
        _push(zones)
    assert info.value.code == RefusalCode.DIGEST


def test_a_zone_without_endpoint_is_reported_before_any_push() -> None:
    zones = _Zones()
    with pytest.raises(RoundError, match="does not include zone zone-c"):
        _push(zones, _message(("zone-a", "zone-b")))
    assert zones.pushed == {}
