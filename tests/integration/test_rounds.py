"""Coordinator + Sites + a real gRPC zone on loopback, sites in-process."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel

from fedshard.aggregation.server_rules import RULES, register
from fedshard.assembly import grpc_connector, make_site, running_zones
from fedshard.config import FederationConfig
from fedshard.coordinator.coordinator import Coordinator
from fedshard.errors import ZoneError
from fedshard.integrity import genesis_version, merkle_root, next_version, shard_digest
from fedshard.protocol.messages import (
    AppliedRound,
    MessageKind,
    PublishedAggregate,
    QueryRequest,
    SiteFailure,
    TrainInstruction,
    TrainReport,
)
from fedshard.site.site import Site
from fedshard.store import LocalShardStore
from fedshard.transports.inprocess import InProcessSiteGateway
from tests.toy_parts import SignMomentum  # a rule of a task's own
from tests.zone_helpers import site_model


def _config(n_sites: int = 3, rounds: int = 3, min_sites: int = 2) -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "toy", "seed": 3, "rounds": rounds, "min_sites": min_sites, "round_timeout_s": 60},
            "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
            "training": {"local_epochs": 5, "batch_size": 8, "learning_rate": 0.05},
            "sharding": {"tile": [4, 4]},
            "zones": [{"name": "z1", "region": "EU"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(n_sites)],
        }
    )


@pytest.fixture()
def federation(tmp_path: Path) -> Iterator[tuple[FederationConfig, dict[str, str], dict[str, Site], Path]]:
    config = _config()
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites}
        yield config, endpoints, sites, tmp_path


def _run(config: FederationConfig, endpoints: dict[str, str], sites: Mapping[str, object]) -> object:
    gateway = InProcessSiteGateway(sites)  # type: ignore[arg-type]
    zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
    try:
        return Coordinator(config, gateway, zones, endpoints).run()
    finally:
        gateway.close()


def test_rounds_extend_the_version_chain_from_zone_aggregates(federation) -> None:
    config, endpoints, sites, tmp_path = federation
    result = _run(config, endpoints, sites)
    assert [r.round for r in result.rounds] == [1, 2, 3]
    assert all(r.sites == ("s0", "s1", "s2") for r in result.rounds)
    # the chain recomputed from what the zone stored equals the coordinator's
    zone_store = LocalShardStore(tmp_path / "zones" / "z1")
    version = result.genesis_version
    for r in result.rounds:
        # the toy model's first layer is personal (EU): a regional EU aggregate beside the rest
        assert {a["group"] for a in r.aggregates} == {"regional/EU", "regional/any"}
        shards = {}
        for group in ("regional-EU", "regional-any"):
            shards.update(zone_store.load(f"aggregate-{r.round:06d}-{group}")[1])
        root = merkle_root({sid: shard_digest(a) for sid, a in shards.items()})
        version = next_version(version, root)
        assert version == r.version
    assert result.version == version
    # every site holds the same parameters, at that version
    metas_shards = [site_model(tmp_path / "sites", s) for s in sites]
    assert {m["version"] for m, _ in metas_shards} == {version}
    first = metas_shards[0][1]
    for _, shards in metas_shards[1:]:
        assert all(np.array_equal(first[k], shards[k]) for k in first)
    # and the federated model learned something
    assert result.rounds[-1].loss < result.rounds[0].loss
    assert result.rounds[-1].bytes_up > 0


class _Counting:
    """Gateway wrapper: every message sent, as (kind, round, the round a train message asks evaluated)."""

    def __init__(self, inner: InProcessSiteGateway) -> None:
        self.inner = inner
        self.sent: list[tuple[str, int, int | None]] = []

    def nodes(self) -> list[str]:
        return self.inner.nodes()

    def send(self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float) -> dict:
        for m in messages.values():
            if kind is not MessageKind.QUERY:
                self.sent.append((kind.value, m.round, getattr(m, "evaluate", None)))  # type: ignore[attr-defined]
        return self.inner.send(kind, messages, timeout)


def _counted_run(config: FederationConfig, endpoints: dict[str, str], sites: Mapping[str, Site]) -> tuple:
    """The federation run over ``sites``; its result and the messages sent."""
    gateway = _Counting(InProcessSiteGateway(sites))
    zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
    try:
        return Coordinator(config, gateway, zones, endpoints).run(), gateway.sent
    finally:
        gateway.inner.close()


def test_each_round_is_one_message_per_site_and_evaluates_as_its_own_message_would(federation, tmp_path: Path) -> None:
    config, endpoints, sites, _ = federation
    carried, sent = _counted_run(config, endpoints, sites)
    # round r's train messages carry round r-1's evaluation; the last round is evaluated alone
    assert sorted(sent) == sorted(
        [("train", 1, None)] * 3 + [("train", 2, 1)] * 3 + [("train", 3, 2)] * 3 + [("evaluate", 3, None)] * 3
    )
    # the same federation, each round evaluated in its own messages: the same figures, bit for bit
    with running_zones(config, tmp_path / "alone-zones") as alone_endpoints:
        alone_sites = {s.id: make_site(config, s.id, tmp_path / "alone-sites") for s in config.sites}
        alone = _Counting(InProcessSiteGateway(alone_sites))
        coordinator = Coordinator(
            config, alone, {n: grpc_connector(n, ep) for n, ep in alone_endpoints.items()}, alone_endpoints
        )
        version = coordinator.discover().version
        try:
            rounds = []
            for rnd in (1, 2, 3):
                rounds.append(coordinator.run_round(rnd, version))
                version = rounds[-1].version
        finally:
            alone.inner.close()
    assert [k for k, _, _ in alone.sent].count("evaluate") == 9
    assert [(r.version, r.accuracy, r.loss) for r in carried.rounds] == [
        (r.version, r.accuracy, r.loss) for r in rounds
    ]
    assert all(0.0 <= r.accuracy <= 1.0 for r in carried.rounds)


def test_a_round_before_one_a_site_sits_out_is_evaluated_alone(federation) -> None:
    config, endpoints, sites, _ = federation
    sampled = config.model_copy(
        update={"federation": config.federation.model_copy(update={"sample_fraction": 0.5, "min_sites": 2})}
    )
    result, sent = _counted_run(sampled, endpoints, sites)
    assert [r.round for r in result.rounds] == [1, 2, 3]
    assert all(len(r.sites) == 2 for r in result.rounds)  # two of three sites train each round
    evaluated = sorted({rnd for kind, rnd, _ in sent if kind == "evaluate"})
    assert evaluated == [1, 2, 3]  # every site evaluates every round: the one sitting out too
    assert not any(asked for kind, _, asked in sent if kind == "train")
    assert all(0.0 <= r.accuracy <= 1.0 for r in result.rounds)


def test_a_site_evaluates_what_its_train_message_asks_even_when_it_then_refuses(federation) -> None:
    config, endpoints, sites, _ = federation
    gateway = InProcessSiteGateway(sites)
    coordinator = Coordinator(config, gateway, {n: grpc_connector(n, ep) for n, ep in endpoints.items()}, endpoints)
    try:
        first = coordinator.run_round(1, coordinator.discover().version)  # evaluated alone: every site applied it
    finally:
        gateway.close()
    asked = {"round": 2, "token": "t", "base_version": first.version, "missed": [], "epochs": 1, "batch_size": 8}
    asked |= {"learning_rate": 0.1, "seed": 1, "evaluate": 1}
    report = sites["s0"].train(TrainInstruction(**asked, zones={}))  # no zone to push to: refused
    assert not report.ok and report.evaluation is not None
    assert (report.evaluation.round, report.evaluation.version) == (1, first.version)
    assert 0.0 <= report.evaluation.accuracy <= 1.0
    with pytest.raises(ValueError, match="not one before round 2"):  # a site evaluates only a round before
        TrainInstruction(**(asked | {"evaluate": 2}), zones={})


def test_genesis_is_shared_and_recomputable(federation) -> None:
    _, _, sites, _ = federation
    site = sites["s0"]
    info = site.query(QueryRequest())
    _, shards = site.store.load()
    root = merkle_root({sid: shard_digest(a) for sid, a in shards.items()})
    assert info.genesis_version == genesis_version(info.plan_digest, root)
    assert {s.query(QueryRequest()).genesis_version for s in sites.values()} == {info.genesis_version}


class _DropSites:
    """Gateway wrapper: the named sites never answer train messages."""

    def __init__(self, inner: InProcessSiteGateway, silent: set[str]) -> None:
        self.inner = inner
        self.silent = silent

    def nodes(self) -> list[str]:
        return self.inner.nodes()

    def send(self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float) -> dict:
        if kind is not MessageKind.TRAIN:
            return self.inner.send(kind, messages, timeout)
        live = {n: m for n, m in messages.items() if n not in self.silent}
        out = self.inner.send(kind, live, timeout)
        out.update({n: SiteFailure(reason="no reply within 1s") for n in messages if n in self.silent})
        return out


def test_round_continues_without_a_silent_site_when_enough_remain(federation) -> None:
    config, endpoints, sites, _ = federation
    gateway = _DropSites(InProcessSiteGateway(sites), {"s2"})
    zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
    result = Coordinator(
        config.model_copy(update={"federation": config.federation.model_copy(update={"rounds": 1})}),
        gateway,
        zones,
        endpoints,
    ).run()
    assert result.rounds[0].sites == ("s0", "s1")
    assert "s2" in result.rounds[0].refused


def test_too_few_sites_aborts_the_round_and_stops(federation) -> None:
    config, endpoints, sites, _ = federation
    gateway = _DropSites(InProcessSiteGateway(sites), {"s1", "s2"})
    zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
    result = Coordinator(config, gateway, zones, endpoints).run()
    assert result.rounds == []
    assert "round 1: only 1 of 3 sites pushed an update (federation.min_sites is 2)" in result.stopped_reason
    # the zone discarded the round: no aggregate was published
    with pytest.raises(ZoneError):
        zones["z1"].fetch(1)


def test_site_refuses_a_round_from_another_model_version(federation) -> None:
    _, endpoints, sites, _ = federation
    site = sites["s0"]
    report = site.train(
        TrainInstruction(
            round=1,
            token="t",
            base_version="00" * 32,
            missed=[],
            zones=endpoints,
            epochs=1,
            batch_size=8,
            learning_rate=0.1,
            seed=1,
        )
    )
    assert isinstance(report, TrainReport)
    assert not report.ok
    assert "model version" in report.reason


def test_site_refuses_an_aggregate_whose_root_differs_from_the_announced_one(federation) -> None:
    config, endpoints, sites, _ = federation
    result = _run(
        config.model_copy(update={"federation": config.federation.model_copy(update={"rounds": 1})}),
        endpoints,
        {"s0": sites["s0"], "s1": sites["s1"]},
    )
    announced = [PublishedAggregate(zone="z1", group="regional/any", merkle_root="ab" * 32)]
    bogus = [AppliedRound(round=1, merkle_root="ab" * 32, aggregates=announced)]
    report = sites["s2"].train(
        TrainInstruction(
            round=2,
            token="t",
            base_version=next_version(result.genesis_version, "ab" * 32),
            missed=bogus,
            zones=endpoints,
            epochs=1,
            batch_size=8,
            learning_rate=0.1,
            seed=1,
        )
    )
    assert not report.ok
    assert "coordinator announced" in report.reason
    # nothing was applied: the site is still at genesis
    meta, _ = sites["s2"].store.load()
    assert meta["applied_round"] == 0 and meta["version"] == result.genesis_version


@pytest.fixture
def sign_momentum() -> Iterator[None]:
    register(SignMomentum())
    yield
    RULES.remove("sign-momentum")


@pytest.mark.parametrize("kind", ["momentum", "adam", "sign-momentum"])
def test_server_optimisers_keep_every_site_on_the_same_model(tmp_path: Path, kind: str, sign_momentum: None) -> None:
    base = _config()
    training = base.training.model_copy(
        update={
            "server_optimizer": base.training.server_optimizer.model_copy(update={"kind": kind, "learning_rate": 0.5})
        }
    )
    config = base.model_copy(update={"training": training})
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites}
        result = _run(config, endpoints, sites)
        snapshots = [site_model(tmp_path / "sites", s) for s in sites]
        assert {meta["rule"] for meta, _ in snapshots} == {f"{kind}:lr=0.5,b1=0.9,b2=0.99,tau=0.001"}
        first = snapshots[0][1]
        assert any(k.startswith("optimizer/m:") for k in first)
        for _, arrays in snapshots[1:]:
            assert first.keys() == arrays.keys()
            assert all(np.array_equal(first[k], arrays[k]) for k in first)
        # a site told to switch rules mid-federation refuses instead of drifting apart
        switched = TrainInstruction(
            round=9,
            token="t",
            base_version=result.version,
            missed=[AppliedRound(round=99, merkle_root="ab" * 32, aggregates=[])],
            zones=endpoints,
            epochs=1,
            batch_size=8,
            learning_rate=0.1,
            seed=1,
        )
        report = sites["s0"].train(switched)
        assert not report.ok and "server optimiser changed mid-federation" in report.reason
