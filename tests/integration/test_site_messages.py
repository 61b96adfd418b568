"""What a site message costs and carries: one model build per site process (through the
ClientApp's own path), catch-up that writes the store once, instructions that do not grow
with the round number, and a site that refuses a head its chain does not reach."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from fedshard.assembly import grpc_connector, make_site, running_zones, site_for
from fedshard.config import FederationConfig
from fedshard.coordinator.coordinator import Coordinator
from fedshard.integrity import next_version
from fedshard.protocol.messages import (
    AppliedRound,
    EvaluateInstruction,
    MessageKind,
    QueryRequest,
    SiteFailure,
    TrainInstruction,
    decode,
    encode,
)
from fedshard.site.site import Site
from fedshard.transports.flower import client_app
from fedshard.transports.flower.records import REQUESTS
from fedshard.transports.inprocess import InProcessSiteGateway
from tests import toy_task


def _config(rounds: int, min_sites: int = 2) -> FederationConfig:
    return FederationConfig.model_validate(
        {
            "federation": {"name": "toy", "seed": 3, "rounds": rounds, "min_sites": min_sites, "round_timeout_s": 60},
            "task": {"target": "tests.toy_task:task", "options": {"examples": 40}},
            "training": {"local_epochs": 2, "batch_size": 8, "learning_rate": 0.05},
            "sharding": {"tile": [4, 4]},
            "zones": [{"name": "z1", "region": "EU"}],
            "sites": [{"id": f"s{i}", "jurisdiction": "EU"} for i in range(3)],
        }
    )


@pytest.fixture()
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every call of the toy task's build_model, from anywhere."""
    calls: list[int] = []
    original = toy_task.ToyTask.build_model

    def counted(self: toy_task.ToyTask) -> Any:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(toy_task.ToyTask, "build_model", counted)
    return calls


class ClientAppGateway:
    """Each message reaches its site the way Flower's ClientApp reaches it, JSON and all."""

    def __init__(self, config_path: Path, state_root: Path, site_ids: list[str]) -> None:
        self._settings = {"config": str(config_path), "state-root": str(state_root)}
        self._ids = site_ids

    def nodes(self) -> list[str]:
        return list(self._ids)

    def send(self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float) -> dict[str, Any]:
        out = {}
        for node, message in messages.items():
            context = SimpleNamespace(node_config={"site-id": node}, run_config={})
            site = client_app._site(context, self._settings)  # type: ignore[arg-type]
            reply = site.handle(kind, decode(REQUESTS[kind], encode(message)))
            out[node] = decode(type(reply), encode(reply))
        return out


def test_a_site_process_builds_its_model_once_across_its_messages(tmp_path: Path, builds: list[int]) -> None:
    config = _config(rounds=3)
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    with running_zones(config, tmp_path / "zones") as endpoints:
        before = len(builds)  # the zones' policy classified the model once for this process
        gateway = ClientAppGateway(path, tmp_path / "sites", [s.id for s in config.sites])
        zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
        result = Coordinator(config, gateway, zones, endpoints).run()
    assert len(result.rounds) == 3 and not result.stopped_reason
    # 3 sites x (1 query + 3 train + 3 evaluate) messages: one build per site, the first
    assert len(builds) - before == 3
    same = client_app._site(SimpleNamespace(node_config={"site-id": "s0"}, run_config={}), gateway._settings)
    assert same is site_for(config, "s0", tmp_path / "sites")  # type: ignore[arg-type]


def test_a_fresh_process_answers_a_query_without_building_the_model(tmp_path: Path, builds: list[int]) -> None:
    config = _config(rounds=1)
    with running_zones(config, tmp_path / "zones") as endpoints:
        query = QueryRequest(zones=endpoints)
        first = make_site(config, "s0", tmp_path / "sites").query(query)
        assert (tmp_path / "sites" / "s0" / "classes.json").exists()
        counted = len(builds)
        again = make_site(config, "s0", tmp_path / "sites").query(query)  # a new Site: a new process
        assert len(builds) == counted
        assert again == first
        # another residency config is another key: the cached classes are not used
        other = config.model_copy(
            update={"residency": config.residency.model_copy(update={"detectors": not config.residency.detectors})}
        )
        make_site(other, "s0", tmp_path / "sites").query(query)
        assert len(builds) == counted + 1


class Recorder:
    """Gateway wrapper: records every instruction (encoded size, missed rounds) and drops some."""

    def __init__(self, inner: InProcessSiteGateway, drop: set[tuple[str, int, str]]) -> None:
        self.inner = inner
        self.drop = drop
        self.sent: list[tuple[str, int, str, int, list[int]]] = []  # kind, round, node, bytes, missed rounds

    def nodes(self) -> list[str]:
        return self.inner.nodes()

    def send(self, kind: MessageKind, messages: Mapping[str, BaseModel], timeout: float) -> dict[str, Any]:
        live = {}
        for node, msg in messages.items():
            rnd = getattr(msg, "round", 0)
            if isinstance(msg, TrainInstruction | EvaluateInstruction):
                self.sent.append((kind.value, rnd, node, len(encode(msg)), [a.round for a in msg.missed]))
            if (kind.value, rnd, node) not in self.drop:
                live[node] = msg
        out = self.inner.send(kind, live, timeout)
        out.update({n: SiteFailure(reason="dropped by the test") for n in messages if n not in live})
        return out


@contextlib.contextmanager
def _federation(config: FederationConfig, tmp_path: Path, drop: set[tuple[str, int, str]]) -> Iterator[Any]:
    with running_zones(config, tmp_path / "zones") as endpoints:
        sites = {s.id: make_site(config, s.id, tmp_path / "sites") for s in config.sites}
        gateway = Recorder(InProcessSiteGateway(sites), drop)
        zones = {n: grpc_connector(n, ep) for n, ep in endpoints.items()}
        try:
            yield sites, gateway, zones, endpoints
        finally:
            gateway.inner.close()


class CountingStore:
    """A site's model store that notes the applied round of every save."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.saves: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def save(self, plan: Any, shards: Any, extras: Any, meta: Mapping[str, Any]) -> None:
        self.saves.append(int(meta["applied_round"]))
        self.inner.save(plan, shards, extras, meta)


def test_instructions_carry_only_the_rounds_a_site_has_not_applied(tmp_path: Path) -> None:
    config = _config(rounds=6)
    with _federation(config, tmp_path, set()) as (_, gateway, zones, endpoints):
        result = Coordinator(config, gateway, zones, endpoints).run()
    assert len(result.rounds) == 6
    # a train message carries exactly the round before it (the site applies and evaluates it, then
    # trains); the last round is evaluated alone, its evaluate message carrying that round
    assert all(missed == [rnd - 1] for kind, rnd, _, _, missed in gateway.sent if kind == "train" and rnd > 1)
    assert all(missed == [] for kind, rnd, _, _, missed in gateway.sent if kind == "train" and rnd == 1)
    assert [(rnd, missed) for kind, rnd, _, _, missed in gateway.sent if kind == "evaluate"] == [(6, [6])] * 3
    sizes = [size for kind, rnd, _, size, _ in gateway.sent if kind == "train" and rnd > 1]
    assert len(sizes) == 15 and max(sizes) - min(sizes) < 32  # round 6's is no bigger than round 2's


def test_a_site_that_missed_rounds_catches_up_with_one_store_write(tmp_path: Path) -> None:
    config = _config(rounds=3)
    drop = {("evaluate", 1, "s2"), ("train", 2, "s2"), ("evaluate", 2, "s2")}
    with _federation(config, tmp_path, drop) as (sites, gateway, zones, endpoints):
        store = CountingStore(sites["s2"].store)
        sites["s2"].store = store
        result = Coordinator(config, gateway, zones, endpoints).run()
    assert [r.sites for r in result.rounds] == [("s0", "s1", "s2"), ("s0", "s1"), ("s0", "s1", "s2")]
    missed = {(kind, rnd): m for kind, rnd, node, _, m in gateway.sent if node == "s2"}
    assert missed[("train", 3)] == [1, 2]  # the coordinator knew where s2 stood from its reports
    # genesis, then rounds 1 and 2 applied in memory and written once, then round 3
    assert store.saves == [0, 2, 3]
    assert store.inner.meta()["version"] == result.rounds[-1].version


def test_a_site_refuses_a_head_its_chain_does_not_reach_and_keeps_its_store(tmp_path: Path) -> None:
    config = _config(rounds=2)
    with _federation(config, tmp_path, set()) as (_, gateway, zones, endpoints):
        result = Coordinator(config, gateway, zones, endpoints).run()
        rounds = [m for kind, rnd, node, _, m in gateway.sent if node == "s0" and m]
        assert rounds == [[1], [2]]  # round 2's train message, then the last round's evaluate message
        fresh = make_site(config.model_copy(), "s0", tmp_path / "fresh")
        genesis = fresh.query(QueryRequest()).genesis_version
        round2 = AppliedRound(round=2, merkle_root=result.rounds[1].roots["EU"], aggregates=[])
        report = fresh.train(
            TrainInstruction(
                round=3,
                token="t",
                base_version=result.version,
                missed=[round2],  # round 1 is missing
                zones=endpoints,
                epochs=1,
                batch_size=8,
                learning_rate=0.1,
                seed=1,
            )
        )
    assert not report.ok and report.applied_round is None
    assert "with rounds 2–2 gives" in report.reason and "\n" not in report.reason
    assert fresh.store.meta()["version"] == genesis and fresh.store.meta()["applied_round"] == 0
    assert next_version(next_version(genesis, result.rounds[0].roots["EU"]), round2.merkle_root) == result.version


def test_sites_of_one_process_share_nothing_but_the_process(tmp_path: Path) -> None:
    config = _config(rounds=1)
    a = site_for(config, "s0", tmp_path / "sites")
    assert site_for(config, "s0", tmp_path / "sites") is a
    assert site_for(config, "s1", tmp_path / "sites") is not a
    assert site_for(config, "s0", tmp_path / "other") is not a
    changed = config.model_copy(update={"training": config.training.model_copy(update={"learning_rate": 0.5})})
    assert site_for(changed, "s0", tmp_path / "sites") is not a
    assert isinstance(a, Site)
