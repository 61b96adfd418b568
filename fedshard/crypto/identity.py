"""Who holds a federation certificate: reading and checking the certificates of every party.

Every certificate names its holder's **role** in :data:`ROLE_OID` (``site``, ``zone``,
``coordinator``, ``superlink``); a site's also carries its **jurisdiction** and every
other party's its **region**, each in a non-critical extension under fedshard's private
OID (:data:`JURISDICTION_OID`, :data:`REGION_OID`) whose value is a DER ``UTF8String``.
:func:`read_identity` trusts those values only after checking the certificate against
the federation CA, so a zone learns where a shard comes from from what the CA signed,
never from what a request claims.

A zone's certificate also holds a DNS name derived from its name and region
(:func:`zone_host`, under the reserved suffix :data:`ZONE_HOST_SUFFIX`). A party that
dials a zone asks TLS for exactly that name (:class:`ZoneId`), so the handshake itself
fails against any other holder of a certificate of the CA: another zone, the same zone
name in another region, the SuperLink, a site.

Certificates from before roles were written (no :data:`ROLE_OID`) are still read, their
role told from the key usages (:attr:`Identity.legacy`); a zone certificate of that age
holds no :func:`zone_host` name, so nobody can dial it as a zone until ``fedshard keys
upgrade`` re-issues it. Issuing lives in :mod:`fedshard.crypto.pki`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedshard.errors import PkiError

__all__ = [
    "CheckedCertificates",
    "JURISDICTION_OID",
    "REGION_OID",
    "ROLE_OID",
    "ZONE_HOST_SUFFIX",
    "Identity",
    "Role",
    "ZoneId",
    "ZoneKey",
    "certificate_fingerprint",
    "claimed_identity",
    "host_names",
    "names_host",
    "read_identity",
    "read_pem",
    "zone_host",
]

JURISDICTION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.59999.1.1")
"""Extension holding a site's jurisdiction (``UTF8String``, non-critical)."""
REGION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.59999.1.2")
"""Extension holding a zone's or the coordinator's region (``UTF8String``, non-critical)."""
ROLE_OID = x509.ObjectIdentifier("1.3.6.1.4.1.59999.1.3")
"""Extension naming the holder's :class:`Role` (``UTF8String``, non-critical), on every
certificate fedshard issues (before roles were written: on the coordinator's only)."""
ZONE_HOST_SUFFIX = "zone.fedshard.invalid"
"""Parent of the DNS names zone certificates hold for their identity (:func:`zone_host`);
``.invalid`` never resolves, so the name can only ever be asked for, never dialled."""

# The same shapes as the config's ``Name`` and ``Jurisdiction`` (fedshard.config._models).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
PLACE_PATTERN = re.compile(r"^[A-Z]{2,8}$")


class Role(StrEnum):
    """What a certificate lets its holder be: a site (TLS client), a zone (TLS server, and
    client of the reducing zone), the coordinator (TLS client that drives rounds) or the
    SuperLink (Flower's TLS server for the sites' SuperNodes; zones refuse it every call)."""

    SITE = "site"
    ZONE = "zone"
    COORDINATOR = "coordinator"
    SUPERLINK = "superlink"


_SERVER_ROLES = frozenset({Role.ZONE, Role.SUPERLINK})
"""Roles whose certificates are TLS server certificates (``serverAuth``)."""


@dataclass(frozen=True, slots=True)
class ZoneId:
    """A zone as the party dialling it knows it from its own config: name and region.

    Attributes
    ----------
    name, region:
        E.g. ``"eu-central"``, ``"EU"``.
    """

    name: str
    region: str

    @property
    def host(self) -> str:
        """The DNS name only this zone's certificate holds (:func:`zone_host`)."""
        return zone_host(self.name, self.region)

    def __str__(self) -> str:
        return f"zone {self.name} ({self.region})"


def zone_host(name: str, region: str) -> str:
    """The DNS name a certificate of zone ``name`` in ``region`` holds for its identity.

    One label under :data:`ZONE_HOST_SUFFIX`: the zone's name and region made DNS-safe
    for people reading the certificate, then 20 hex digits of SHA-256 over the exact
    name and region, so two zones (or one name in two regions, or names that differ
    only in case or in characters DNS has not) never share it.
    """
    readable = re.sub(r"[^a-z0-9-]", "-", name.lower())[:24].strip("-") or "zone"
    digest = hashlib.sha256(f"fedshard zone\0{name}\0{region}".encode()).hexdigest()[:20]
    return f"{readable}-{region.lower()}-{digest}.{ZONE_HOST_SUFFIX}"


@dataclass(frozen=True)
class Identity:
    """Who holds a certificate, as the federation CA vouched for it.

    Attributes
    ----------
    name:
        ``site_id`` of a site or name of a zone (the subject's CN).
    role:
        The holder's :class:`Role`, from :data:`ROLE_OID` (checked against the
        extended key usage), or from the key usage alone for a :attr:`legacy` one.
    jurisdiction_or_region:
        A site's jurisdiction or another party's region (e.g. ``"EU"``).
    fingerprint:
        SHA-256 of the certificate (DER), hex; names the certificate in audit records.
    legacy:
        Issued before roles were written (no :data:`ROLE_OID`): ``fedshard keys upgrade``
        re-issues it; a zone's of that age cannot be dialled as the zone.
    """

    name: str
    role: Role
    jurisdiction_or_region: str
    fingerprint: str
    legacy: bool = False

    def __str__(self) -> str:
        return f"{self.role.value} {self.name} ({self.jurisdiction_or_region})"


def read_identity(cert_pem: bytes, ca_pem: bytes, *, now: datetime | None = None) -> Identity:
    """Check a site or zone certificate against the federation CA and say whom it names.

    Checks that ``cert_pem`` is signed by the CA in ``ca_pem``, that both are valid at
    ``now``, that it is an end-entity certificate of a zone (TLS server key usage; zones
    are TLS clients too, of the reducing zone) or a site (TLS client only), and that it
    carries the matching region or jurisdiction.

    Parameters
    ----------
    cert_pem:
        The certificate to check (PEM; only the first certificate is read).
    ca_pem:
        The federation CA's certificate (PEM).
    now:
        Time to check validity at (aware datetime); default: now.

    Returns
    -------
    Identity
        Name, role and jurisdiction (site) or region (zone).

    Raises
    ------
    PkiError
        Any check fails; the message says which.
    """
    when = aware_now(now)
    cert = load_cert(cert_pem, "certificate")
    ca = load_cert(ca_pem, "CA certificate")
    ca_name = _common_name(ca) or ca.subject.rfc4514_string()
    if not is_ca(ca):
        raise PkiError(f"{ca_name!r} is not a CA certificate: pass the federation's ca.pem")
    subject = _common_name(cert) or cert.subject.rfc4514_string()
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise PkiError(f"certificate of {subject!r} was not issued by the federation CA {ca_name!r}") from None
    check_validity(ca, when, f"federation CA {ca_name!r}")
    check_validity(cert, when, f"certificate of {subject!r}")
    if is_ca(cert):
        raise PkiError(f"{subject!r} is a CA certificate, not a site or zone certificate")
    return _identity(cert, subject)


def claimed_identity(cert_pem: bytes) -> Identity:
    """Whom a certificate names, *without* checking who issued it or when it is valid.

    For messages (what a peer that failed a check holds instead) and for tools that
    check the chain otherwise; never for a decision on its own.

    Raises
    ------
    PkiError
        It is not a certificate, or names no role, name and place fedshard writes.
    """
    cert = load_cert(cert_pem, "certificate")
    return _identity(cert, _common_name(cert) or cert.subject.rfc4514_string())


def _identity(cert: x509.Certificate, subject: str) -> Identity:
    role, legacy = _role(cert, subject)
    name = _common_name(cert)
    if name is None or not NAME_PATTERN.match(name):
        raise PkiError(f"certificate of {subject!r} has no valid CN naming the {role.value}")
    oid = JURISDICTION_OID if role is Role.SITE else REGION_OID
    what = "jurisdiction" if role is Role.SITE else "region"
    place = _text_extension(cert, oid)
    if place is None:
        raise PkiError(f"certificate of {role.value} {name!r} carries no {what}: re-issue it with fedshard")
    if not PLACE_PATTERN.match(place):
        raise PkiError(f"certificate of {role.value} {name!r} carries a malformed {what}")
    return Identity(name, role, place, certificate_fingerprint(cert), legacy)


def dns_names(cert: x509.Certificate) -> list[str]:
    """The DNS names among a certificate's subject alternative names."""
    try:
        return list(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        )
    except x509.ExtensionNotFound:
        return []


def host_names(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses among a certificate's subject alternative names."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*sans.get_values_for_type(x509.DNSName), *map(str, sans.get_values_for_type(x509.IPAddress))]


def names_host(cert: x509.Certificate, host: str) -> bool:
    """Whether ``cert`` names ``host`` (a DNS name, case-insensitive, or an IP address) among its
    subject alternative names: what TLS checks of the server a party dials."""
    try:
        wanted = str(ipaddress.ip_address(host))
    except ValueError:
        wanted = host.lower().rstrip(".")
    return wanted in (name.lower() for name in host_names(cert))


def read_pem(path: str | os.PathLike[str]) -> bytes:
    """Read a certificate or key file, with a one-line error naming the file if it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise PkiError(f"cannot read {path}: {exc.strerror or exc}; check the path") from None


# -- reading (also used by fedshard.crypto.pki) ----------------------------------------------------------


def load_cert(pem: bytes, what: str) -> x509.Certificate:
    """Parse a PEM certificate; :class:`PkiError` naming ``what`` if it is not one."""
    try:
        return x509.load_pem_x509_certificate(pem)
    except (ValueError, TypeError):
        raise PkiError(f"{what} is not a PEM X.509 certificate") from None


def is_ca(cert: x509.Certificate) -> bool:
    """Whether ``cert`` says it is a CA (basic constraints)."""
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _common_name(cert: x509.Certificate) -> str | None:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        return None
    value = names[0].value
    return value if isinstance(value, str) else None


def _role(cert: x509.Certificate, subject: str) -> tuple[Role, bool]:
    """The holder's role, and whether it was told from the key usages alone (legacy)."""
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = set()
    server = ExtendedKeyUsageOID.SERVER_AUTH in usages
    client = ExtendedKeyUsageOID.CLIENT_AUTH in usages
    try:
        raw = cert.extensions.get_extension_for_oid(ROLE_OID).value
    except x509.ExtensionNotFound:
        raw = None
    if raw is None:  # issued before roles were written (the coordinator's always named it)
        if server:
            return Role.ZONE, True  # zones may also be TLS clients (of the reducing zone)
        if client:
            return Role.SITE, True
        raise PkiError(f"certificate of {subject!r} is neither a site (clientAuth) nor a zone (serverAuth) certificate")
    named = utf8_string_decode(raw.value) if isinstance(raw, x509.UnrecognizedExtension) else None
    try:
        role = Role(named or "")
    except ValueError:
        raise PkiError(f"certificate of {subject!r} names an unknown role {named!r}") from None
    if role in _SERVER_ROLES and not server:
        raise PkiError(f"certificate of {subject!r} claims the {role.value} role without a server key usage")
    if role not in _SERVER_ROLES and (server or not client):
        raise PkiError(f"certificate of {subject!r} claims the {role.value} role with another party's key usage")
    return role, False


def _text_extension(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> str | None:
    try:
        raw = cert.extensions.get_extension_for_oid(oid).value
    except x509.ExtensionNotFound:
        return None
    return (utf8_string_decode(raw.value) if isinstance(raw, x509.UnrecognizedExtension) else None) or ""


class CheckedCertificates:
    """:func:`read_identity` for one CA, remembering the certificates it checked.

    A zone reads its caller's certificate for every call, twice (when it admits the call
    and when the handler checks the caller's role), and most calls come from the same
    few parties; checking one costs about 0.2 ms (the CA's signature). A certificate
    checked before is answered from memory while the time lies within both its and the
    CA's validity; outside that window it is checked again, and so refused. At most
    ``size`` certificates are remembered (least recently used forgotten first).
    """

    def __init__(self, ca_pem: bytes, size: int = 1024) -> None:
        self.ca_pem = ca_pem
        self._size = size
        self._known: OrderedDict[bytes, tuple[Identity, datetime, datetime]] = OrderedDict()
        self._lock = threading.Lock()

    def identity(self, cert_pem: bytes, *, now: datetime | None = None) -> Identity:
        """Who ``cert_pem`` names, as :func:`read_identity` checks it; raises :class:`PkiError` as it does."""
        when = aware_now(now)
        with self._lock:
            known = self._known.get(cert_pem)
            if known is not None and known[1] <= when <= known[2]:
                self._known.move_to_end(cert_pem)
                return known[0]
        identity = read_identity(cert_pem, self.ca_pem, now=when)
        cert, ca = load_cert(cert_pem, "certificate"), load_cert(self.ca_pem, "CA certificate")
        start = max(cert.not_valid_before_utc, ca.not_valid_before_utc)
        end = min(cert.not_valid_after_utc, ca.not_valid_after_utc)
        with self._lock:
            self._known[cert_pem] = (identity, start, end)
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        return identity


def check_validity(cert: x509.Certificate, when: datetime, what: str) -> None:
    """Raise :class:`PkiError` unless ``cert`` is valid at ``when``."""
    if when < cert.not_valid_before_utc:
        raise PkiError(f"{what} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: check the clock")
    if when > cert.not_valid_after_utc:
        raise PkiError(f"{what} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: issue a new one")


# -- DER UTF8String, the value of the jurisdiction and region extensions ------------------------------------


def utf8_string(text: str) -> bytes:
    """DER encoding of ``text`` as an ASN.1 ``UTF8String``."""
    data = text.encode("utf-8")
    n = len(data)
    if n < 0x80:
        length = bytes([n])
    else:
        size = (n.bit_length() + 7) // 8
        length = bytes([0x80 | size]) + n.to_bytes(size, "big")
    return b"\x0c" + length + data


def utf8_string_decode(der: bytes) -> str | None:
    """Inverse of :func:`utf8_string`; ``None`` for anything else (no exceptions on bad input)."""
    if len(der) < 2 or der[0] != 0x0C:
        return None
    n, start = der[1], 2
    if n & 0x80:
        size = n & 0x7F
        if size == 0 or size > 2 or len(der) < 2 + size:
            return None
        n, start = int.from_bytes(der[2 : 2 + size], "big"), 2 + size
    if len(der) != start + n:
        return None
    try:
        return der[start:].decode("utf-8")
    except UnicodeDecodeError:
        return None


# -- time --------------------------------------------------------------------------------------------------


def aware_now(now: datetime | None) -> datetime:
    """``now``, or the current time when ``None``; refuses naive datetimes."""
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (e.g. datetime.now(UTC))")
    return now


def certificate_fingerprint(cert: x509.Certificate) -> str:
    """The SHA-256 of ``cert``'s DER encoding, hex: how statements and identities name a certificate."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


class ZoneKey:
    """A zone's signing key and its certificate: what signs its audit head and its aggregates
    (ECDSA with SHA-256, the zone's TLS key).

    Raises
    ------
    PkiError
        The key or certificate cannot be read, or they do not belong together.
    """

    def __init__(self, key_pem: bytes, cert_pem: bytes) -> None:
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError):
            raise PkiError("the zone key is not an unencrypted PEM private key") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise PkiError("the zone key is not an elliptic-curve key: issue it with `fedshard pki issue-zone`")
        cert = load_cert(cert_pem, "zone certificate")
        if cert.public_key() != key.public_key():
            raise PkiError("the zone key does not belong to the zone certificate: pass the matching --key and --cert")
        self._key = key
        self.certificate = cert
        self.certificate_pem: bytes = cert.public_bytes(serialization.Encoding.PEM)
        self.fingerprint: str = certificate_fingerprint(cert)

    def sign(self, data: bytes) -> bytes:
        """The zone's signature of ``data``."""
        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))
