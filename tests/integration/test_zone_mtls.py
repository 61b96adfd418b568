"""The zone data plane over mutual TLS with the federation PKI, on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedshard.crypto.pki import init_ca, issue_coordinator, issue_site, issue_zone
from fedshard.crypto.tls import TlsFiles
from fedshard.errors import PushRejectedError, RefusalCode, ZoneError
from fedshard.protocol.rounds import RoundSpec
from fedshard.sharding import ShardPlan
from fedshard.zone.aggregator import ZoneAggregator
from fedshard.zone.rpc.client import GrpcZoneClient
from fedshard.zone.rpc.service import serve
from tests.zone_helpers import BASE, TOKEN, manifest_for, random_update

PLAN = ShardPlan.from_state_dict({"w": np.zeros((6, 8), np.float32)}, tile=(4, 4))


@pytest.fixture()
def pki(tmp_path: Path) -> dict[str, TlsFiles]:
    ca = init_ca(tmp_path / "ca")
    zone = issue_zone(tmp_path / "ca", "eu-1", "EU", tmp_path / "zones")
    files = {"zone": TlsFiles(zone.cert, zone.key, ca.cert)}
    coordinator = issue_coordinator(tmp_path / "ca", "EU", tmp_path / "coordinator")
    files["coordinator"] = TlsFiles(coordinator.cert, coordinator.key, ca.cert)
    for site in ("site-a", "site-b"):
        paths = issue_site(tmp_path / "ca", site, "EU", tmp_path / "sites")
        files[site] = TlsFiles(paths.cert, paths.key, ca.cert)
    other_ca = init_ca(tmp_path / "other-ca")
    rogue = issue_site(tmp_path / "other-ca", "site-a", "EU", tmp_path / "rogue")
    files["rogue"] = TlsFiles(rogue.cert, rogue.key, other_ca.cert)
    return files


@pytest.fixture()
def endpoint(pki: dict[str, TlsFiles]) -> Iterator[str]:
    server, port = serve(ZoneAggregator("eu-1", "EU"), "127.0.0.1:0", tls=pki["zone"])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def _open(endpoint: str, tls: TlsFiles) -> None:
    with GrpcZoneClient(endpoint, timeout=10, tls=tls) as client:
        client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a", "site-b")))


def _close(endpoint: str, pki: dict[str, TlsFiles]) -> None:
    with GrpcZoneClient(endpoint, timeout=10, tls=pki["coordinator"]) as client:
        client.close_round(1)


def test_push_over_mtls_from_the_site_the_certificate_names(endpoint: str, pki: dict[str, TlsFiles]) -> None:
    _open(endpoint, pki["coordinator"])
    update = random_update(1, PLAN)
    with GrpcZoneClient(endpoint, timeout=10, tls=pki["site-a"]) as client:
        receipt = client.push(manifest_for("site-a", update, plan=PLAN), TOKEN, update)
        assert receipt.site_id == "site-a"
    with GrpcZoneClient(endpoint, timeout=10, tls=pki["coordinator"]) as client:
        summary = client.close_round(1)[0]
    assert summary.sites == ("site-a",)


@pytest.mark.parametrize("who", ["site-a", "zone"])
def test_only_the_coordinator_drives_rounds(endpoint: str, pki: dict[str, TlsFiles], who: str) -> None:
    with GrpcZoneClient(endpoint, timeout=10, tls=pki[who]) as client:
        with pytest.raises(PushRejectedError, match="may not open-round; only a coordinator") as info:
            client.open_round(RoundSpec(1, TOKEN, PLAN.to_json(), BASE, ("site-a",)))
        assert info.value.code is RefusalCode.AUTHORITY
    _open(endpoint, pki["coordinator"])
    with GrpcZoneClient(endpoint, timeout=10, tls=pki[who]) as client:
        with pytest.raises(PushRejectedError, match="may not abort-round"):
            client.abort_round(1)
        with pytest.raises(PushRejectedError, match="may not close-round"):
            client.close_round(1)
    update = random_update(1, PLAN)  # the round is still open for the sites
    with GrpcZoneClient(endpoint, timeout=10, tls=pki["site-a"]) as client:
        client.push(manifest_for("site-a", update, plan=PLAN), TOKEN, update)


def test_a_site_cannot_push_a_manifest_in_another_sites_name(endpoint: str, pki: dict[str, TlsFiles]) -> None:
    _open(endpoint, pki["coordinator"])
    update = random_update(1, PLAN)
    with GrpcZoneClient(endpoint, timeout=10, tls=pki["site-b"]) as client:
        with pytest.raises(
            PushRejectedError, match="manifest names site 'site-a' but the caller's certificate is 'site-b'"
        ) as info:
            client.push(manifest_for("site-a", update, plan=PLAN), TOKEN, update)
        assert info.value.code is RefusalCode.IDENTITY
        good = random_update(2, PLAN)
        client.push(manifest_for("site-b", good, plan=PLAN), TOKEN, good)
        with GrpcZoneClient(endpoint, timeout=10, tls=pki["coordinator"]) as lead:
            summary = lead.close_round(1)[0]
        aggregate = client.fetch(1).means
    assert summary.sites == ("site-b",)  # the refused push counted nothing
    np.testing.assert_array_equal(aggregate["w#r0c0"], good["w#r0c0"])


def test_a_certificate_from_another_ca_fails_the_handshake(endpoint: str, pki: dict[str, TlsFiles]) -> None:
    with GrpcZoneClient(endpoint, timeout=5, tls=pki["rogue"]) as client, pytest.raises(ZoneError, match="unreachable"):
        client.info()


def test_a_plain_text_client_is_refused(endpoint: str) -> None:
    with GrpcZoneClient(endpoint, timeout=5) as client, pytest.raises(ZoneError, match="unreachable"):
        client.info()
