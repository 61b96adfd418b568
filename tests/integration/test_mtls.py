"""Mutual TLS on the zone data plane: real gRPC on 127.0.0.1 with the federation PKI.

A tiny service answers who called it (name and jurisdiction read from the client
certificate via :func:`peer_identity`), so each test shows both what the handshake
lets through and what the handler learns.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from fedshard.crypto.identity import Role, read_identity
from fedshard.crypto.pki import CertPaths, init_ca, issue_site, issue_zone
from fedshard.crypto.tls import INSECURE_WARNING, channel_credentials, peer_identity, server_credentials
from fedshard.errors import PkiError

METHOD = "/fedshard.test.Whoami/Who"


@dataclass
class Pki:
    ca_pem: bytes
    zone: CertPaths
    site: CertPaths
    other_site: CertPaths
    rogue_ca_pem: bytes
    rogue_site: CertPaths
    expired_site: CertPaths


@dataclass
class Zone:
    secure: str
    insecure: str
    calls: list[str]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = init_ca(root / "ca", now=datetime.now(UTC) - timedelta(days=60))  # old enough to have expired a cert
    rogue = init_ca(root / "rogue", "fedshard federation CA")  # same name, another key
    return Pki(
        ca_pem=ca.cert.read_bytes(),
        zone=issue_zone(root / "ca", "eu-1", "EU", root / "zone"),
        site=issue_site(root / "ca", "hospital-a", "EU", root / "sites"),
        other_site=issue_site(root / "ca", "bank-sg", "SG", root / "sites"),
        rogue_ca_pem=rogue.cert.read_bytes(),
        rogue_site=issue_site(root / "rogue", "hospital-a", "EU", root / "rogue-sites"),
        expired_site=issue_site(
            root / "ca", "old-site", "EU", root / "expired", now=datetime.now(UTC) - timedelta(days=40), days=30
        ),
    )


@pytest.fixture(scope="module")
def zone(pki: Pki) -> Iterator[Zone]:
    calls: list[str] = []

    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            identity = peer_identity(context, pki.ca_pem)
        except PkiError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        calls.append(identity.name)
        return f"{identity.name}:{identity.jurisdiction_or_region}".encode()

    handler = grpc.method_handlers_generic_handler(
        "fedshard.test.Whoami", {"Who": grpc.unary_unary_rpc_method_handler(who)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    creds = server_credentials(pki.zone.cert.read_bytes(), pki.zone.key.read_bytes(), pki.ca_pem)
    secure_port = server.add_secure_port("127.0.0.1:0", creds)
    insecure_port = server.add_insecure_port("127.0.0.1:0")
    assert secure_port and insecure_port
    server.start()
    try:
        yield Zone(f"127.0.0.1:{secure_port}", f"127.0.0.1:{insecure_port}", calls)
    finally:
        server.stop(grace=None).wait(timeout=10)


def _call(endpoint: str, creds: grpc.ChannelCredentials | None, options: list[tuple[str, str]] | None = None) -> bytes:
    channel = grpc.insecure_channel(endpoint) if creds is None else grpc.secure_channel(endpoint, creds, options)
    with channel:
        reply: bytes = channel.unary_unary(METHOD)(b"", timeout=10)
        return reply


def _client(pki: Pki, paths: CertPaths, ca_pem: bytes | None = None) -> grpc.ChannelCredentials:
    return channel_credentials(ca_pem or pki.ca_pem, paths.cert.read_bytes(), paths.key.read_bytes())


def test_site_with_ca_signed_certificate_is_accepted(pki: Pki, zone: Zone) -> None:
    assert _call(zone.secure, _client(pki, pki.site)) == b"hospital-a:EU"
    assert _call(zone.secure, _client(pki, pki.other_site)) == b"bank-sg:SG"


def test_dns_name_in_certificate_also_verifies(pki: Pki, zone: Zone) -> None:
    options = [("grpc.ssl_target_name_override", "localhost")]
    assert _call(zone.secure, _client(pki, pki.site), options) == b"hospital-a:EU"


def _refused(endpoint: str, creds: grpc.ChannelCredentials | None, calls: list[str]) -> grpc.StatusCode:
    before = list(calls)
    with pytest.raises(grpc.RpcError) as info:
        _call(endpoint, creds)
    assert calls == before, "the handler must not run"
    code: grpc.StatusCode = info.value.code()
    return code


def test_certificate_from_another_ca_fails_the_handshake(pki: Pki, zone: Zone) -> None:
    assert _refused(zone.secure, _client(pki, pki.rogue_site), zone.calls) is grpc.StatusCode.UNAVAILABLE


def test_client_without_certificate_is_refused(pki: Pki, zone: Zone) -> None:
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_pem)
    assert _refused(zone.secure, creds, zone.calls) is grpc.StatusCode.UNAVAILABLE


def test_expired_client_certificate_fails_the_handshake(pki: Pki, zone: Zone) -> None:
    assert _refused(zone.secure, _client(pki, pki.expired_site), zone.calls) is grpc.StatusCode.UNAVAILABLE


def test_site_refuses_a_zone_it_does_not_trust(pki: Pki, zone: Zone) -> None:
    creds = _client(pki, pki.site, ca_pem=pki.rogue_ca_pem)
    assert _refused(zone.secure, creds, zone.calls) is grpc.StatusCode.UNAVAILABLE


def test_site_refuses_a_zone_certificate_for_another_host(pki: Pki, zone: Zone) -> None:
    before = list(zone.calls)
    with pytest.raises(grpc.RpcError) as info:
        _call(zone.secure, _client(pki, pki.site), [("grpc.ssl_target_name_override", "zone.elsewhere")])
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert zone.calls == before


def test_zone_certificate_identifies_a_zone_when_it_calls_another_zone(pki: Pki, zone: Zone) -> None:
    """Zones forward partial sums to the reducing zone as TLS clients: the handshake succeeds, but
    the caller is a zone, so a service that expects a site refuses it."""
    assert read_identity(pki.zone.cert.read_bytes(), pki.ca_pem).role is Role.ZONE
    with pytest.raises(grpc.RpcError) as info:
        _call(zone.secure, _client(pki, pki.zone))
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "holds a zone certificate, not a site one" in (info.value.details() or "")


def test_insecure_port_has_no_peer_identity(zone: Zone) -> None:
    before = list(zone.calls)
    with pytest.raises(grpc.RpcError) as info:
        _call(zone.insecure, None)
    assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "no client certificate" in (info.value.details() or "")
    assert zone.calls == before


def test_bad_pem_fails_before_the_handshake(pki: Pki) -> None:
    with pytest.raises(PkiError, match="not PEM"):
        server_credentials(b"", pki.zone.key.read_bytes(), pki.ca_pem)
    with pytest.raises(PkiError, match="not PEM"):
        channel_credentials(pki.ca_pem, pki.site.cert.read_bytes(), Path("key").as_posix().encode())


def test_insecure_warning_is_loud() -> None:
    assert "WITHOUT TLS" in INSECURE_WARNING and "--insecure" in INSECURE_WARNING


class _FakeContext:
    """Just enough of a servicer context for :func:`peer_identity`."""

    def __init__(self, pem: bytes | None) -> None:
        self._auth = {"x509_pem_cert": [pem]} if pem else {}

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


def test_peer_identity_checks_the_role(pki: Pki) -> None:
    zone_pem = pki.zone.cert.read_bytes()
    with pytest.raises(PkiError, match="holds a zone certificate, not a site one"):
        peer_identity(_FakeContext(zone_pem), pki.ca_pem)
    assert peer_identity(_FakeContext(zone_pem), pki.ca_pem, role=None).name == "eu-1"
    with pytest.raises(PkiError, match="no client certificate"):
        peer_identity(_FakeContext(None), pki.ca_pem)
