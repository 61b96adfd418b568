"""Contract tests of the ZoneClient protocol, run against every backend: a zone called
in this process (``in_process_connector``) and a zone served over gRPC on loopback.

Both have the protocol's methods with its signatures, and give the same answers:
ciphertexts come back as ``bytes`` flagged ``encrypted`` by the summary, means as
arrays, and a refusal as the zone's error class with its code and its one line.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterator

import numpy as np
import pytest

from fedshard.crypto.he import HeCodec, he_init, load_context
from fedshard.errors import AggregateNotFoundError, PushRejectedError, RefusalCode, ZoneError
from fedshard.integrity import build_manifest, ciphertext_digest
from fedshard.protocol.channels import ZoneClient
from fedshard.protocol.rounds import Aggregate, RoundSpec, ShardPayload
from fedshard.sharding import ShardPlan
from fedshard.transports.inprocess import InProcessZoneClient, in_process_connector
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve
from tests.zone_helpers import BASE, TOKEN

SITES = ("site-a", "site-b")
PLAN = ShardPlan.from_state_dict({"w": np.zeros((2, 3000), np.float32), "b": np.zeros(30, np.float32)}, tile=(32, 4096))
ENCRYPTED, CLEAR = PLAN.shard_ids[0], PLAN.shard_ids[1]

_PROTOCOL_METHODS = sorted(
    name for name, value in vars(ZoneClient).items() if inspect.isfunction(value) and not name.startswith("_")
)


def test_the_protocol_lists_the_zone_client_methods() -> None:
    assert _PROTOCOL_METHODS == ["abort_round", "close", "close_round", "fetch", "forward", "open_round", "push"]


@pytest.mark.parametrize("backend", [InProcessZoneClient, GrpcZoneClient])
@pytest.mark.parametrize("name", _PROTOCOL_METHODS)
def test_every_backend_has_the_protocol_signature(backend: type, name: str) -> None:
    """Same parameters (names, kinds, defaults) and the same types as ZoneClient declares."""
    want, got = getattr(ZoneClient, name), getattr(backend, name)
    want_params = [(p.name, p.kind, p.default) for p in inspect.signature(want).parameters.values()]
    got_params = [(p.name, p.kind, p.default) for p in inspect.signature(got).parameters.values()]
    assert got_params == want_params
    assert typing.get_type_hints(got) == typing.get_type_hints(want)


@pytest.fixture(scope="module")
def he(tmp_path_factory: pytest.TempPathFactory) -> tuple[HeCodec, object]:
    secret, public = he_init(tmp_path_factory.mktemp("he"))
    return HeCodec(load_context(secret, secret=True), value_range=1.0), load_context(public, secret=False)


@pytest.fixture(params=["inprocess", "grpc"])
def zone_client(
    request: pytest.FixtureRequest, he: tuple[HeCodec, object]
) -> Iterator[tuple[ZoneClient, ZoneAggregator]]:
    """A client of a fresh zone ``eu-1`` (with a public CKKS context), through each backend."""
    zone = ZoneAggregator("eu-1", "EU", he_context=he[1])
    if request.param == "inprocess":
        client = in_process_connector({"eu-1": zone})("eu-1", "")
        yield client, zone
        client.close()
        return
    server, port = serve(zone, "127.0.0.1:0", max_workers=4)
    client = GrpcZoneClient(f"127.0.0.1:{port}", timeout=20, chunk_bytes=1000)
    try:
        yield client, zone
    finally:
        client.close()
        server.stop(grace=None).wait(timeout=10)


def _update(seed: int, codec: HeCodec) -> tuple[dict[str, ShardPayload], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    clear = rng.normal(0, 0.1, PLAN.shard(CLEAR).shape).astype(np.float32)
    values = rng.normal(0, 0.1, PLAN.shard(ENCRYPTED).shape)
    return {ENCRYPTED: codec.encrypt(values, 1.0)[0], CLEAR: clear}, values, clear


def _manifest(site: str, payload: dict[str, ShardPayload], weight: float = 1.0):  # type: ignore[no-untyped-def]
    return build_manifest(
        site_id=site, round=1, plan_digest=PLAN.digest, base_version=BASE, zone="eu-1", weight=weight,
        shards=payload, encrypted=frozenset({ENCRYPTED}),
    )  # fmt: skip


class TestZoneClientContract:
    """Every backend gives the same behaviour through the ZoneClient protocol."""

    def test_a_round_is_served_as_means_and_ciphertext_bytes(
        self, zone_client: tuple[ZoneClient, ZoneAggregator], he: tuple[HeCodec, object]
    ) -> None:
        client, _ = zone_client
        codec = he[0]
        client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES, weights=(("site-b", 3.0),)))
        a, a_values, a_clear = _update(1, codec)
        b, b_values, b_clear = _update(2, codec)
        receipt = client.push(_manifest("site-a", a, weight=1.0), TOKEN, a)
        client.push(_manifest("site-b", b, weight=3.0), TOKEN, b)
        (summary,) = client.close_round(1)

        aggregate = client.fetch(1)

        assert (receipt.zone, receipt.site_id, receipt.shards) == ("eu-1", "site-a", 2)
        assert isinstance(aggregate, Aggregate) and aggregate.summary == summary
        assert {e.shard_id: e.encrypted for e in summary.shards} == {ENCRYPTED: True, CLEAR: False}
        data = aggregate.ciphertexts[ENCRYPTED]
        assert type(data) is bytes and set(aggregate.means) == {CLEAR}
        entry = next(e for e in summary.shards if e.encrypted)
        assert (entry.digest, entry.nbytes) == (ciphertext_digest(data), len(data))
        np.testing.assert_allclose(aggregate.means[CLEAR], (1.0 * a_clear + 3.0 * b_clear) / 4.0, rtol=1e-6)
        # sites weigh encrypted shards inside the ciphertext (here both 1.0): the plain mean
        mean = codec.decrypt_mean(data, PLAN.shard(ENCRYPTED).size).reshape(PLAN.shard(ENCRYPTED).shape)
        np.testing.assert_allclose(mean, (a_values + b_values) / 2, atol=codec.step)

    def test_a_refused_push_raises_the_zones_code_and_line(
        self, zone_client: tuple[ZoneClient, ZoneAggregator], he: tuple[HeCodec, object]
    ) -> None:
        client, zone = zone_client
        client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, SITES))
        payload, _, _ = _update(1, he[0])
        manifest = _manifest("site-a", payload)
        payload[CLEAR] = payload[CLEAR] + 1  # type: ignore[operator]  # not what the manifest's digest covers

        with pytest.raises(PushRejectedError) as info:
            client.push(manifest, TOKEN, payload)

        assert info.value.code is RefusalCode.DIGEST
        assert str(info.value) == (
            f"zone eu-1 refused site-a's push for round 1: shard {CLEAR}: digest does not match the manifest"
        )
        assert zone.stats.pushes == 0 and zone.stats.refused == 1
        assert client.close_round(1) == []  # nothing counted

    def test_an_aggregate_never_published_is_not_found(self, zone_client: tuple[ZoneClient, ZoneAggregator]) -> None:
        client, _ = zone_client
        with pytest.raises(AggregateNotFoundError) as info:
            client.fetch(7, site_id="site-a")
        assert info.value.code is RefusalCode.NOT_FOUND
        assert "zone eu-1: no regional/any aggregate for round 7" in str(info.value)


def test_the_in_process_connector_names_the_zones_it_knows() -> None:
    connect = in_process_connector({"eu-1": ZoneAggregator("eu-1", "EU")})
    assert isinstance(connect("eu-1", "ignored"), InProcessZoneClient)
    with pytest.raises(ZoneError, match=r"no zone named 'us-1' in this process \(known: eu-1\)"):
        connect("us-1", "")
