"""A served zone takes a new membership between rounds, on the coordinator's word only,
from its own config file (the ``Reconfigure`` call over mutual TLS, on loopback); and
the coordinator's :class:`FolderMembership` hands a prepared change to every zone or
waits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from fedshard.assembly import make_zone
from fedshard.assembly.routing import FederationRouting
from fedshard.config import load_federation
from fedshard.config.changes import membership_digest
from fedshard.crypto.pki import init_ca, issue_coordinator, issue_site, issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.deploy.loopback import free_ports
from fedshard.errors import PushRejectedError, RefusalCode, ZoneError
from fedshard.membership.deployed import READY, FolderMembership
from fedshard.membership.zone_reload import ZoneReload
from fedshard.protocol.rounds import RoundSpec
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve

ROOT = Path(__file__).resolve().parents[2]


def _configs(ports: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """configs/grow.yaml and configs/grow-more.yaml on ``ports`` (eu, us, sg, uk)."""
    base = yaml.safe_load((ROOT / "configs" / "grow.yaml").read_text())
    grown = yaml.safe_load((ROOT / "configs" / "grow-more.yaml").read_text())
    for config in (base, grown):
        for zone, port in zip(config["zones"], ports, strict=False):
            zone["endpoint"] = f"127.0.0.1:{port}"
    return base, grown


@dataclass
class Zone:
    endpoint: str
    config: Path
    audit: Path
    tls: dict[str, TlsFiles]
    grown: dict[str, Any]

    def client(self, who: str = "coordinator") -> GrpcZoneClient:
        return GrpcZoneClient(self.endpoint, timeout=10, tls=self.tls[who])

    def write(self, config: dict[str, Any]) -> None:
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture()
def zone(tmp_path: Path) -> Iterator[Zone]:
    """eu-central of configs/grow.yaml, served with mutual TLS from its config file."""
    ports = free_ports(4)
    base, grown = _configs(ports)
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    ca = init_ca(tmp_path / "ca")
    issued = issue_zone(tmp_path / "ca", "eu-central", "EU", tmp_path / "zones")
    tls = {"zone": TlsFiles(issued.cert, issued.key, ca.cert)}
    coordinator = issue_coordinator(tmp_path / "ca", "EU", tmp_path / "coordinator")
    tls["coordinator"] = TlsFiles(coordinator.cert, coordinator.key, ca.cert)
    for site, jurisdiction in (("eu-1", "EU"), ("uk-2", "UK")):
        paths = issue_site(tmp_path / "ca", site, jurisdiction, tmp_path / "sites")
        tls[site] = TlsFiles(paths.cert, paths.key, ca.cert)
    config = load_federation(path)
    routing = FederationRouting(config)
    aggregator = make_zone(config.zones[0], tmp_path / "stores", routing=routing, tls=tls["zone"])
    reload = ZoneReload(aggregator, path, routing)
    server, port = serve(aggregator, f"127.0.0.1:{ports[0]}", tls=tls["zone"], reload=reload)
    try:
        yield Zone(f"127.0.0.1:{port}", path, tmp_path / "stores" / "eu-central" / "audit.jsonl", tls, grown)
    finally:
        server.stop(grace=None)
        aggregator.close()


def _digest(config: dict[str, Any], tmp: Path) -> str:
    path = tmp / "digest.yaml"
    path.write_text(yaml.safe_dump(config))
    return membership_digest(load_federation(path))


def test_only_the_coordinator_may_reconfigure_a_zone(zone: Zone, tmp_path: Path) -> None:
    with zone.client("eu-1") as client, pytest.raises(PushRejectedError, match="may not reconfigure") as info:
        client.reconfigure(_digest(zone.grown, tmp_path))
    assert info.value.code is RefusalCode.AUTHORITY
    assert '"refused"' in zone.audit.read_text() and '"reconfigure"' in zone.audit.read_text()


def test_a_zone_takes_the_membership_of_its_own_file_when_it_matches(zone: Zone, tmp_path: Path) -> None:
    digest = _digest(zone.grown, tmp_path)
    # the site that will join is not a member yet: even Info is refused
    with zone.client("uk-2") as client, pytest.raises(PushRejectedError) as info:
        client.info()
    assert info.value.code is RefusalCode.MEMBER
    # the zone's host has not been given the new config: the coordinator's word is not enough
    with zone.client() as client, pytest.raises(ZoneError, match="lists other parties"):
        client.reconfigure(digest)
    with zone.client() as client, pytest.raises(ZoneError, match="64 hex characters"):
        client.reconfigure("not a digest")
    zone.write(zone.grown)
    with zone.client() as client:
        reply = client.reconfigure(digest)
    assert reply["sites"] == 6 and reply["zones"] == 4
    with zone.client("uk-2") as client:
        assert client.info() == ("eu-central", "EU")
    assert '"reconfigured"' in zone.audit.read_text()


def test_a_zone_refuses_a_change_a_running_federation_may_not_take(zone: Zone, tmp_path: Path) -> None:
    removed = yaml.safe_load(zone.config.read_text())
    removed["zones"] = removed["zones"][:2]  # sg-central gone
    zone.write(removed)
    with zone.client() as client, pytest.raises(ZoneError, match="zone sg-central is missing"):
        client.reconfigure(_digest(removed, tmp_path))


def test_a_zone_refuses_to_reconfigure_while_a_round_is_open(zone: Zone, tmp_path: Path) -> None:
    from fedshard.assembly.routing import model_classes

    plan = model_classes(load_federation(zone.config))[0]
    with zone.client() as client:
        client.open_round(RoundSpec(1, "t" * 32, plan.to_json(), "0" * 64, ("eu-1",)))
    zone.write(zone.grown)
    with zone.client() as client, pytest.raises(ZoneError, match="round 1 is open; reconfigure between rounds"):
        client.reconfigure(_digest(zone.grown, tmp_path))
    with zone.client() as client:
        client.abort_round(1)
        assert client.reconfigure(_digest(zone.grown, tmp_path))["sites"] == 6


def _serve(path: Path, name: str, store: Path) -> tuple[grpc.Server, Any]:
    """Zone ``name`` of the config in ``path``, served in plain text at its endpoint, reloadable."""
    config = load_federation(path)
    routing = FederationRouting(config)
    zc = next(z for z in config.zones if z.name == name)
    aggregator = make_zone(zc, store, routing=routing)
    server, _ = serve(aggregator, zc.endpoint, reload=ZoneReload(aggregator, path, routing))
    return server, aggregator


def test_the_coordinator_takes_a_prepared_change_once_every_zone_has(tmp_path: Path) -> None:
    """FolderMembership: the new UK zone is not up yet: the change waits (the file stays
    ready); once it is, every zone takes the change and so does the coordinator."""
    eu, uk = free_ports(2)
    base: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "grow.yaml").read_text())
    base["zones"] = [{"name": "eu-central", "region": "EU", "endpoint": f"127.0.0.1:{eu}"}]
    base["sites"] = [s for s in base["sites"] if s["jurisdiction"] in ("EU", "UK")]
    base["federation"]["min_sites"] = 2
    grown = json.loads(json.dumps(base))
    grown["zones"].append({"name": "uk-south", "region": "UK", "endpoint": f"127.0.0.1:{uk}"})
    grown["sites"].append({"id": "uk-2", "jurisdiction": "UK"})
    run = tmp_path / "run"
    run.mkdir()
    path = run / "federation.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    servers = [_serve(path, "eu-central", tmp_path / "stores")]
    try:
        path.write_text(yaml.safe_dump(grown, sort_keys=False))  # what the aggregator host does first
        (run / READY).write_text(path.read_text())
        membership = FolderMembership(load_federation(_file(tmp_path, base)), run, {}, None)
        assert membership.before_round(3) is None  # uk-south does not listen yet
        assert (run / READY).exists()
        servers.append(_serve(path, "uk-south", tmp_path / "stores"))
        change = membership.before_round(4)
        assert change is not None and change.description == "zone uk-south added; site(s) uk-2 joined"
        assert set(change.zones) == {"eu-central", "uk-south"}
        assert not (run / READY).exists() and (run / "reconfigure.applied-4.yaml").exists()
        assert membership.before_round(5) is None
        membership.close()
    finally:
        for server, aggregator in servers:
            server.stop(grace=None)
            aggregator.close()
    for name in ("eu-central", "uk-south"):  # eu-central took it twice (idempotent), uk-south once it was up
        assert '"reconfigured"' in (tmp_path / "stores" / name / "audit.jsonl").read_text()


def _file(tmp: Path, config: dict[str, Any]) -> Path:
    path = tmp / "base.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_zone_served_without_a_config_file_refuses_reconfiguration(tmp_path: Path) -> None:
    from fedshard.zone.aggregator import ZoneAggregator

    server, port = serve(ZoneAggregator("eu-1", "EU"), "127.0.0.1:0")
    try:
        with GrpcZoneClient(f"127.0.0.1:{port}", timeout=10) as client, pytest.raises(ZoneError, match="not started"):
            client.reconfigure("a" * 64)
    finally:
        server.stop(grace=None)
