"""The federation PKI: one CA, server certificates for zones and the SuperLink, client
certificates for sites and for the coordinator (the one identity zones let drive rounds).

Every key is ECDSA P-256 (what gRPC's BoringSSL handles best) and every certificate
is signed with SHA-256. Every certificate names its holder's role; a site's carries
its **jurisdiction** and every other party's its **region** in an extension under
fedshard's private OID, and a zone's also holds the DNS name of its identity (see
:mod:`fedshard.crypto.identity`, re-exported here with :func:`read_identity`); the
subject's ``OU`` repeats the place (``jurisdiction=EU``) for humans reading
``openssl x509 -text``.

:func:`reissue` brings a certificate from before roles were written up to date, from
the CA's key and the certificate alone: its holder keeps its key pair, so nothing
secret moves (``fedshard keys upgrade``).

Files are written once, atomically, keys ``0600`` and certificates ``0644``;
issuing again refuses to overwrite them unless ``force=True`` (``--force``).

All functions take ``now`` (an aware :class:`~datetime.datetime`, default: the
current time) so that validity can be tested without waiting for it to pass.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedshard.crypto.identity import (
    JURISDICTION_OID,
    NAME_PATTERN,
    PLACE_PATTERN,
    REGION_OID,
    ROLE_OID,
    ZONE_HOST_SUFFIX,
    Identity,
    Role,
    aware_now,
    check_validity,
    claimed_identity,
    dns_names,
    is_ca,
    load_cert,
    read_identity,
    read_pem,
    utf8_string,
    zone_host,
)
from fedshard.crypto.key_files import CERT_MODE, KEY_MODE, refuse_existing, write_files
from fedshard.errors import ConfigError, PkiError

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "JURISDICTION_OID",
    "REGION_OID",
    "CaPaths",
    "CertPaths",
    "Identity",
    "Role",
    "init_ca",
    "issue_coordinator",
    "issue_site",
    "issue_superlink",
    "issue_zone",
    "read_identity",
    "read_pem",
    "reissue",
]

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
_HOST = re.compile(r"^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})$")
_CLOCK_SKEW = timedelta(minutes=5)  # certificates start a little early: clocks of sites and zones differ


@dataclass(frozen=True)
class CaPaths:
    """Files written by :func:`init_ca`."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class CertPaths:
    """Files written by :func:`issue_zone` and :func:`issue_site`."""

    cert: Path
    key: Path


def init_ca(
    out_dir: str | os.PathLike[str],
    name: str = "fedshard federation CA",
    *,
    now: datetime | None = None,
    days: int = 3650,
    force: bool = False,
) -> CaPaths:
    """Create the federation CA: ``ca.pem`` (certificate) and ``ca.key`` (private key, ``0600``).

    Parameters
    ----------
    out_dir:
        Folder to write into (created if missing). Keep ``ca.key`` offline: whoever
        holds it can mint site certificates for any jurisdiction.
    name:
        Common name of the CA.
    now:
        Issue time (aware datetime); default: now.
    days:
        Validity in days.
    force:
        Overwrite existing files (every certificate issued by the old CA stops working).

    Returns
    -------
    CaPaths
        Paths of the certificate and the key.

    Raises
    ------
    PkiError
        A file exists and ``force`` is false, or the files cannot be written.
    """
    when = aware_now(now)
    _check_days(days)
    if not name.strip():
        raise ConfigError("the CA name must not be empty")
    out = Path(out_dir)
    paths = CaPaths(out / CA_CERT_FILE, out / CA_KEY_FILE)
    refuse_existing((paths.cert, paths.key), force)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedshard"),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(when - _CLOCK_SKEW)
        .not_valid_after(when + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    write_files([(paths.key, _key_pem(key), KEY_MODE), (paths.cert, _cert_pem(cert), CERT_MODE)], force)
    return paths


def issue_zone(
    ca_dir: str | os.PathLike[str],
    zone: str,
    region: str,
    out_dir: str | os.PathLike[str],
    *,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    now: datetime | None = None,
    days: int = 825,
    force: bool = False,
) -> CertPaths:
    """Issue a zone's TLS server certificate: ``<zone>.pem`` and ``<zone>.key`` in ``out_dir``.

    Parameters
    ----------
    ca_dir:
        Folder holding ``ca.pem`` and ``ca.key``.
    zone:
        Zone name (the certificate's CN), e.g. ``"eu-central"``.
    region:
        Region the zone runs in, e.g. ``"EU"``; recorded in the certificate.
    out_dir:
        Folder to write into (created if missing).
    hosts:
        DNS names and IP addresses clients use to reach the zone (subject alternative names).
    now, days, force:
        Issue time (default: now), validity in days (cut to the CA's), overwrite existing files.

    Returns
    -------
    CertPaths
        Paths of the certificate and the key.

    Raises
    ------
    PkiError
        The CA is missing, invalid or expired, or a file exists and ``force`` is false.
    ConfigError
        ``zone``, ``region`` or a host is malformed.
    """
    _check_name(zone, "zone name")
    _check_place(region, "region")
    sans = _sans((hosts,) if isinstance(hosts, str) else hosts)  # one host given as a plain string
    sans.append(x509.DNSName(zone_host(zone, region)))  # the name a dialling party asks TLS for
    return _issue(ca_dir, out_dir, zone, Role.ZONE, region, sans, now=now, days=days, force=force)


def issue_superlink(
    ca_dir: str | os.PathLike[str],
    region: str,
    out_dir: str | os.PathLike[str],
    *,
    name: str = "superlink",
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    now: datetime | None = None,
    days: int = 825,
    force: bool = False,
) -> CertPaths:
    """Issue the SuperLink's TLS server certificate: ``<name>.pem`` and ``<name>.key`` in ``out_dir``.

    Its role is ``superlink``: sites' SuperNodes dial it, and zones refuse it every call.
    It holds no zone's identity name, so no party dialling a zone accepts it.

    Parameters
    ----------
    ca_dir:
        Folder holding ``ca.pem`` and ``ca.key``.
    region:
        Region the SuperLink runs in, e.g. ``"EU"``; recorded in the certificate.
    out_dir:
        Folder to write into (created if missing).
    name:
        The certificate's CN.
    hosts:
        DNS names and IP addresses sites dial the SuperLink at.
    now, days, force:
        Issue time (default: now), validity in days (cut to the CA's), overwrite existing files.

    Raises
    ------
    PkiError
        The CA is missing, invalid or expired, or a file exists and ``force`` is false.
    ConfigError
        ``name``, ``region`` or a host is malformed.
    """
    _check_name(name, "SuperLink name")
    _check_place(region, "region")
    sans = _sans((hosts,) if isinstance(hosts, str) else hosts)
    return _issue(ca_dir, out_dir, name, Role.SUPERLINK, region, sans, now=now, days=days, force=force)


def issue_site(
    ca_dir: str | os.PathLike[str],
    site_id: str,
    jurisdiction: str,
    out_dir: str | os.PathLike[str],
    *,
    now: datetime | None = None,
    days: int = 825,
    force: bool = False,
) -> CertPaths:
    """Issue a site's TLS client certificate: ``<site_id>.pem`` and ``<site_id>.key`` in ``out_dir``.

    The jurisdiction goes into the certificate, so zones enforce residency on what
    the CA signed rather than on what a request claims.

    Parameters
    ----------
    ca_dir:
        Folder holding ``ca.pem`` and ``ca.key``.
    site_id:
        The site's id (the certificate's CN).
    jurisdiction:
        The site's jurisdiction, e.g. ``"EU"``.
    out_dir:
        Folder to write into (created if missing).
    now, days, force:
        Issue time (default: now), validity in days (cut to the CA's), overwrite existing files.

    Returns
    -------
    CertPaths
        Paths of the certificate and the key.

    Raises
    ------
    PkiError
        The CA is missing, invalid or expired, or a file exists and ``force`` is false.
    ConfigError
        ``site_id`` or ``jurisdiction`` is malformed.
    """
    _check_name(site_id, "site id")
    _check_place(jurisdiction, "jurisdiction")
    return _issue(ca_dir, out_dir, site_id, Role.SITE, jurisdiction, [], now=now, days=days, force=force)


def issue_coordinator(
    ca_dir: str | os.PathLike[str],
    region: str,
    out_dir: str | os.PathLike[str],
    *,
    name: str = "coordinator",
    now: datetime | None = None,
    days: int = 825,
    force: bool = False,
) -> CertPaths:
    """Issue the coordinator's TLS client certificate: ``<name>.pem`` and ``<name>.key`` in ``out_dir``.

    Zones let only this role open, close or abort a round (:data:`ROLE_OID` says
    ``coordinator``; a site or zone certificate cannot).

    Parameters
    ----------
    ca_dir:
        Folder holding ``ca.pem`` and ``ca.key``.
    region:
        Region the coordinator runs in, e.g. ``"EU"``; recorded in the certificate.
    out_dir:
        Folder to write into (created if missing).
    name:
        The certificate's CN.
    now, days, force:
        Issue time (default: now), validity in days (cut to the CA's), overwrite existing files.

    Raises
    ------
    PkiError
        The CA is missing, invalid or expired, or a file exists and ``force`` is false.
    ConfigError
        ``name`` or ``region`` is malformed.
    """
    _check_name(name, "coordinator name")
    _check_place(region, "region")
    return _issue(ca_dir, out_dir, name, Role.COORDINATOR, region, [], now=now, days=days, force=force)


# -- issuing -------------------------------------------------------------------------------------------------


def _issue(
    ca_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    name: str,
    role: Role,
    place: str,
    sans: list[x509.GeneralName],
    *,
    now: datetime | None,
    days: int,
    force: bool,
) -> CertPaths:
    when = aware_now(now)
    _check_days(days)
    out = Path(out_dir)
    paths = CertPaths(out / f"{name}.pem", out / f"{name}.key")
    refuse_existing((paths.cert, paths.key), force)
    ca, ca_key = _load_ca(Path(ca_dir), when)
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(when + timedelta(days=days), ca.not_valid_after_utc)
    cert = _certificate(ca, ca_key, key.public_key(), name, role, place, sans, when, not_after)
    write_files([(paths.key, _key_pem(key), KEY_MODE), (paths.cert, _cert_pem(cert), CERT_MODE)], force)
    return paths


_USAGES = {
    # A zone is a TLS server to sites and the coordinator, and a TLS client of the
    # reducing zone when it forwards partial sums; the SuperLink is a server only.
    Role.SITE: ("jurisdiction", JURISDICTION_OID, [ExtendedKeyUsageOID.CLIENT_AUTH]),
    Role.ZONE: ("region", REGION_OID, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
    Role.COORDINATOR: ("region", REGION_OID, [ExtendedKeyUsageOID.CLIENT_AUTH]),
    Role.SUPERLINK: ("region", REGION_OID, [ExtendedKeyUsageOID.SERVER_AUTH]),
}


def _certificate(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    public_key: ec.EllipticCurvePublicKey,
    name: str,
    role: Role,
    place: str,
    sans: list[x509.GeneralName],
    not_before: datetime,
    not_after: datetime,
) -> x509.Certificate:
    """A certificate of ``role`` for ``public_key``, signed by the CA."""
    label, oid, eku = _USAGES[role]
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedshard"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, f"{label}={place}"),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before - _CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .add_extension(x509.UnrecognizedExtension(oid, utf8_string(place)), critical=False)
        .add_extension(x509.UnrecognizedExtension(ROLE_OID, utf8_string(role.value)), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def reissue(
    ca_dir: str | os.PathLike[str], cert_path: str | os.PathLike[str], role: Role, *, now: datetime | None = None
) -> Identity | None:
    """Bring the certificate in ``cert_path`` up to date for ``role``, keeping its key pair.

    A certificate that already names ``role`` (and, for a zone, holds its identity name)
    is left as it is: None. Otherwise the CA issues a new one for the same public key,
    name, place and hosts, valid until the old one expired, and it replaces the file
    atomically (the private key is neither read nor moved); its identity is returned.
    ``role`` may differ from the old certificate's only to make the SuperLink's
    certificate (issued as a zone's before roles were written) a SuperLink's.

    Raises
    ------
    PkiError
        The certificate was not issued by this CA, has expired, or holds another role.
    """
    when = aware_now(now)
    path = Path(cert_path)
    pem = read_pem(path)
    ca, ca_key = _load_ca(Path(ca_dir), when)
    identity = read_identity(pem, _cert_pem(ca), now=when)
    cert = load_cert(pem, f"certificate {path}")
    if identity.role is not role and not (identity.legacy and identity.role is Role.ZONE and role is Role.SUPERLINK):
        raise PkiError(f"{path} is the certificate of {identity}, not of a {role.value}: leave it, or re-issue it")
    hosts = dns_names(cert)
    wanted = zone_host(identity.name, identity.jurisdiction_or_region)
    current = not identity.legacy and identity.role is role and (role is not Role.ZONE or wanted in hosts)
    if current:
        return None
    try:
        old_sans = list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        old_sans = []
    sans = [n for n in old_sans if not (isinstance(n, x509.DNSName) and n.value.endswith(ZONE_HOST_SUFFIX))]
    if role is Role.ZONE:
        sans.append(x509.DNSName(wanted))
    public_key = cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise PkiError(f"{path} holds no elliptic-curve key: issue a new certificate and key instead")
    place = identity.jurisdiction_or_region
    fresh = _certificate(ca, ca_key, public_key, identity.name, role, place, sans, when, cert.not_valid_after_utc)
    write_files([(path, _cert_pem(fresh), CERT_MODE)], True)
    return claimed_identity(_cert_pem(fresh))


def _load_ca(ca_dir: Path, when: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = load_cert(read_pem(ca_dir / CA_CERT_FILE), f"CA certificate {ca_dir / CA_CERT_FILE}")
    key_path = ca_dir / CA_KEY_FILE
    try:
        key = serialization.load_pem_private_key(read_pem(key_path), password=None)
    except (ValueError, TypeError) as exc:
        raise PkiError(f"{key_path} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not is_ca(cert):
        raise PkiError(f"{ca_dir} does not hold a fedshard CA: create one with init_ca (`fedshard keys`)")
    if key.public_key() != cert.public_key():
        raise PkiError(f"{key_path} is not the key of {ca_dir / CA_CERT_FILE}: restore the matching pair")
    check_validity(cert, when, f"federation CA in {ca_dir}")
    return cert, key


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _sans(hosts: Iterable[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not _HOST.match(host):
                raise ConfigError(f"host {host!r} is neither an IP address nor a DNS name") from None
            sans.append(x509.DNSName(host))
    if not sans:
        raise ConfigError("a zone certificate needs at least one host (DNS name or IP address)")
    return sans


# -- checks and files ----------------------------------------------------------------------------------------


def _check_days(days: int) -> None:
    if days < 1:
        raise ConfigError(f"certificate validity must be at least 1 day, got {days}")


def _check_name(name: str, what: str) -> None:
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"{what} {name!r} must be 1-63 letters, digits, '.', '_' or '-', starting alphanumeric")


def _check_place(place: str, what: str) -> None:
    if not PLACE_PATTERN.match(place):
        raise ConfigError(f"{what} {place!r} must be 2-8 upper-case letters, e.g. 'EU'")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)
