"""Mutual TLS for the zone data plane (gRPC), from the federation PKI's files.

Both ends authenticate: a zone only completes a handshake with a client whose
certificate the federation CA signed, and a party that dials a zone completes one only
with the zone it expects: :func:`zone_channel_options` asks TLS for the name only that
zone's certificate holds (:func:`~fedshard.crypto.identity.zone_host`, from the zone's
name and region as the dialling party's own config has them), so a certificate the CA
issued to anyone else (another zone, the same zone name in another region, the
SuperLink) fails the handshake, and nothing is sent. When it fails,
:func:`describe_peer` reads what the peer holds instead, for a one-line error. A zone
asks :func:`peer_identity` who is calling, and gets the site's jurisdiction from the
certificate rather than from the request.

Running without TLS is an explicit, loud opt-out (``--insecure``); print
:data:`INSECURE_WARNING` when it is taken.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import grpc

from fedshard.crypto.identity import (
    CheckedCertificates,
    Identity,
    Role,
    ZoneId,
    claimed_identity,
    dns_names,
    host_names,
    load_cert,
    names_host,
    read_identity,
)
from fedshard.errors import PkiError

__all__ = [
    "INSECURE_WARNING",
    "PEER_CERT_KEY",
    "TlsFiles",
    "channel_credentials",
    "describe_peer",
    "describe_superlink",
    "peer_identity",
    "server_credentials",
    "zone_channel_options",
]

INSECURE_WARNING = (
    "WARNING: --insecure: the zone data plane runs WITHOUT TLS. Gradient shards, manifests and round tokens "
    "cross the network in clear text, and zones cannot tell which site (or jurisdiction) is calling, so "
    "residency is enforced on what requests claim. Use this only on a loopback or test network."
)

PEER_CERT_KEY = "x509_pem_cert"
"""Key of the peer's certificate (PEM) in a gRPC auth context."""


def server_credentials(cert_pem: bytes, key_pem: bytes, ca_pem: bytes) -> grpc.ServerCredentials:
    """Credentials for a zone's gRPC server that require a client certificate signed by the CA.

    Parameters
    ----------
    cert_pem, key_pem:
        The zone's certificate and private key (from :func:`fedshard.crypto.pki.issue_zone`).
    ca_pem:
        The federation CA's certificate; only clients it signed complete the handshake.

    Returns
    -------
    grpc.ServerCredentials
        Pass to ``server.add_secure_port(address, credentials)``.
    """
    _check_pem(cert_pem, "certificate")
    _check_pem(key_pem, "private key")
    _check_pem(ca_pem, "CA certificate")
    return grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True)


def channel_credentials(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> grpc.ChannelCredentials:
    """Credentials for a site's (or coordinator's) channel to a zone: trust the CA, present a client certificate.

    Parameters
    ----------
    ca_pem:
        The federation CA's certificate; the zone must present a certificate it signed
        whose subject alternative names include the host dialled.
    cert_pem, key_pem:
        The client's certificate and private key (from :func:`fedshard.crypto.pki.issue_site`).

    Returns
    -------
    grpc.ChannelCredentials
        Pass to ``grpc.secure_channel(endpoint, credentials)``.
    """
    _check_pem(ca_pem, "CA certificate")
    _check_pem(cert_pem, "certificate")
    _check_pem(key_pem, "private key")
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)


def zone_channel_options(zone: ZoneId) -> list[tuple[str, str]]:
    """Channel options that make TLS accept only ``zone``'s certificate.

    gRPC then checks the server's certificate against :attr:`ZoneId.host` instead of the
    host dialled (and sends it as SNI): only a certificate the CA issued to that zone
    name in that region holds it.
    """
    return [("grpc.ssl_target_name_override", zone.host)]


def describe_peer(endpoint: str, tls: TlsFiles, zone: ZoneId, *, timeout: float = 5.0) -> str | None:
    """Why the server at ``endpoint`` is not ``zone``, read from the certificate it presents
    (a TLS handshake of Python's :mod:`ssl`, showing this party's own certificate); None if
    no handshake completes (the zone is down or unreachable) or it *is* ``zone``.

    For the one line a party prints when gRPC's handshake failed: it names the zone
    expected and what the peer is instead.
    """
    pem = _peer_certificate(endpoint, tls, timeout)
    if pem is None:
        return None
    where = f"the server at {endpoint} is not {zone}"
    try:
        held = read_identity(pem, tls.read()[2])
    except PkiError as exc:
        claimed = _claimed(pem)
        return f"{where}: its certificate fails the federation's checks ({exc}){claimed}"
    if held.role is Role.ZONE and (held.name, held.jurisdiction_or_region) == (zone.name, zone.region):
        if zone.host in dns_names(load_cert(pem, "peer certificate")):
            return None
        return (
            f"{where}: it holds {held}'s certificate from before zone identities; "
            "run `fedshard keys upgrade` where the federation's keys are kept, then restart the zone"
        )
    return f"{where}: it holds the certificate of {held}; refusing to send it anything"


def describe_superlink(endpoint: str, ca_pem: bytes, *, timeout: float = 5.0) -> str | None:
    """Why the server at ``endpoint`` is not this federation's SuperLink, read from the
    certificate it presents; None if no handshake completes (the aggregator is not up yet:
    the caller retries) or it is one.

    A site checks this before its SuperNode dials: a certificate another CA issued (keys of
    another federation) or one of another role (``deployment.superlink`` pointing at a
    zone's port) is permanent, and retrying for minutes would only hide it.
    """
    pem = _peer_certificate(endpoint, None, timeout)
    if pem is None:
        return None
    try:
        held = read_identity(pem, ca_pem)
    except PkiError as exc:
        claimed = _claimed(pem)
        hint = ""
        if "was not issued" in str(exc):
            hint = (
                ": this party's keys and the aggregator's come from different `fedshard keys init` runs; ask the "
                "aggregator's operator for this party's bundle"
            )
        return f"the server at {endpoint} is not this federation's SuperLink: {exc}{claimed}{hint}"
    if held.role is not Role.SUPERLINK:
        return (
            f"the server at {endpoint} holds the certificate of {held} (role {held.role.value}), not the SuperLink's: "
            "deployment.superlink points at another party's port; give the SuperLink's address"
        )
    host = endpoint.rpartition(":")[0].strip("[]")
    cert = load_cert(pem, "SuperLink certificate")
    if names_host(cert, host):
        return None
    return (
        f"the SuperLink's certificate does not name {host} (it names {', '.join(host_names(cert))}); dial a name "
        "it holds in deployment.superlink, or list this one in the aggregator config's deployment.hosts and issue "
        "the federation's keys again (`fedshard keys init`)"
    )


def _claimed(pem: bytes) -> str:
    """``; it claims to be …`` for a certificate that failed the federation's checks (empty
    when it names no identity fedshard writes)."""
    try:
        return f"; it claims to be {claimed_identity(pem)}"
    except PkiError:
        return ""


def _peer_certificate(endpoint: str, tls: TlsFiles | None, timeout: float) -> bytes | None:
    """The certificate (PEM) the server at ``endpoint`` shows this party (presenting ``tls``'s
    own, when given); None if no TLS handshake completes."""
    host, _, port = endpoint.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # read what it holds; the caller checks it against the CA
    context.set_alpn_protocols(["h2"])
    try:
        if tls is not None:
            context.load_cert_chain(tls.cert, tls.key)
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host.strip("[]")) as conn,
        ):
            der = conn.getpeercert(binary_form=True)
    except (OSError, ValueError):
        return None
    return ssl.DER_cert_to_PEM_cert(der).encode("ascii") if der else None


def peer_identity(
    context: grpc.ServicerContext,
    ca_pem: bytes,
    *,
    role: Role | None = Role.SITE,
    now: datetime | None = None,
    checked: CheckedCertificates | None = None,
) -> Identity:
    """Who is calling: the identity in the client certificate of the current RPC.

    The handshake has already checked the chain; this checks it again with
    :func:`~fedshard.crypto.identity.read_identity` (validity, key usage) and reads
    the name and jurisdiction the CA signed.

    Parameters
    ----------
    context:
        The servicer context of the RPC being handled.
    ca_pem:
        The federation CA's certificate.
    role:
        Role the caller must have (default: a site); ``None`` accepts either.
    now:
        Time to check validity at (aware datetime); default: now.
    checked:
        The certificates already checked against ``ca_pem`` (a zone keeps one: every
        call reads its caller's certificate); None: check from scratch.

    Returns
    -------
    Identity
        The caller's name, role and jurisdiction (site) or region (zone).

    Raises
    ------
    PkiError
        The call carries no client certificate (an insecure port), the certificate
        fails a check, or the caller has another role.
    """
    certs = context.auth_context().get(PEER_CERT_KEY) or []
    if not certs:
        raise PkiError("the caller presented no client certificate: serve the zone with mTLS (not --insecure)")
    if checked is not None and checked.ca_pem == ca_pem:
        identity = checked.identity(certs[0], now=now)
    else:
        identity = read_identity(certs[0], ca_pem, now=now)
    if role is not None and identity.role is not role:
        raise PkiError(f"caller {identity.name!r} holds a {identity.role.value} certificate, not a {role.value} one")
    return identity


def _check_pem(data: bytes, what: str) -> None:
    # gRPC reports a bad PEM only at the first handshake, far from its cause; fail here instead.
    if not isinstance(data, bytes) or b"-----BEGIN " not in data:
        raise PkiError(f"TLS {what} is not PEM data: pass the file's bytes (read_pem), not its path")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One party's TLS material: its certificate and key, and the federation CA."""

    cert: Path
    key: Path
    ca: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """``(cert_pem, key_pem, ca_pem)``; raises :class:`PkiError` naming a missing file."""
        out = []
        for path in (self.cert, self.key, self.ca):
            try:
                out.append(Path(path).read_bytes())
            except OSError as exc:
                raise PkiError(f"cannot read TLS file {path}: {exc.strerror or exc}") from None
        return out[0], out[1], out[2]

    def server(self) -> grpc.ServerCredentials:
        """Server credentials that require a CA-signed client certificate."""
        cert, key, ca = self.read()
        return server_credentials(cert, key, ca)

    def channel(self) -> grpc.ChannelCredentials:
        """Channel credentials presenting this party's certificate."""
        cert, key, ca = self.read()
        return channel_credentials(ca, cert, key)
