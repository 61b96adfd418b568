"""Who holds a federation certificate: reading and checking site and zone certificates.

A site's certificate carries its **jurisdiction** and a zone's (or the coordinator's)
its **region**, each in a non-critical extension under fedshard's private OID
(:data:`JURISDICTION_OID`, :data:`REGION_OID`) whose value is a DER ``UTF8String``.
The coordinator's certificate also says so in :data:`ROLE_OID`: it is the only
identity a zone lets open, close or abort a round. :func:`read_identity`
trusts that value only after checking the certificate against the federation CA,
so a zone learns where a shard comes from from what the CA signed, never from what
a request claims. Issuing lives in :mod:`fedshard.crypto.pki`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedshard.errors import PkiError

__all__ = ["JURISDICTION_OID", "REGION_OID", "ROLE_OID", "Identity", "Role", "read_identity", "read_pem"]

JURISDICTION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.59999.1.1")
"""Extension holding a site's jurisdiction (``UTF8String``, non-critical)."""
REGION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.59999.1.2")
"""Extension holding a zone's or the coordinator's region (``UTF8String``, non-critical)."""
ROLE_OID = x509.ObjectIdentifier("1.3.6.1.4.1.59999.1.3")
"""Extension naming a role the key usages cannot tell apart (``UTF8String``, non-critical):
``"coordinator"`` on the coordinator's client certificate."""

# The same shapes as the config's ``Name`` and ``Jurisdiction`` (fedshard.config.models).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
PLACE_PATTERN = re.compile(r"^[A-Z]{2,8}$")


class Role(StrEnum):
    """What a certificate lets its holder be: a site (TLS client), a zone (TLS server, and
    client of the reducing zone) or the coordinator (TLS client that drives rounds)."""

    SITE = "site"
    ZONE = "zone"
    COORDINATOR = "coordinator"


@dataclass(frozen=True)
class Identity:
    """Who holds a certificate, as the federation CA vouched for it.

    Attributes
    ----------
    name:
        ``site_id`` of a site or name of a zone (the subject's CN).
    role:
        :attr:`Role.SITE`, :attr:`Role.ZONE` or :attr:`Role.COORDINATOR`, from the
        extended key usage and :data:`ROLE_OID`.
    jurisdiction_or_region:
        A site's jurisdiction or a zone's (coordinator's) region (e.g. ``"EU"``).
    fingerprint:
        SHA-256 of the certificate (DER), hex; names the certificate in audit records.
    """

    name: str
    role: Role
    jurisdiction_or_region: str
    fingerprint: str


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
    role = _role(cert, subject)
    name = _common_name(cert)
    if name is None or not NAME_PATTERN.match(name):
        raise PkiError(f"certificate of {subject!r} has no valid CN naming the {role.value}")
    oid = JURISDICTION_OID if role is Role.SITE else REGION_OID
    what = "jurisdiction" if role is Role.SITE else "region"
    try:
        raw = cert.extensions.get_extension_for_oid(oid).value
    except x509.ExtensionNotFound:
        raise PkiError(f"certificate of {role.value} {name!r} carries no {what}: re-issue it with fedshard") from None
    place = utf8_string_decode(raw.value) if isinstance(raw, x509.UnrecognizedExtension) else None
    if place is None or not PLACE_PATTERN.match(place):
        raise PkiError(f"certificate of {role.value} {name!r} carries a malformed {what}")
    fingerprint = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    return Identity(name, role, place, fingerprint)


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


def _role(cert: x509.Certificate, subject: str) -> Role:
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = set()
    try:
        raw = cert.extensions.get_extension_for_oid(ROLE_OID).value
    except x509.ExtensionNotFound:
        raw = None
    if raw is not None:
        named = utf8_string_decode(raw.value) if isinstance(raw, x509.UnrecognizedExtension) else None
        if named != Role.COORDINATOR.value or ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
            raise PkiError(f"certificate of {subject!r} names an unknown role {named!r}")
        if ExtendedKeyUsageOID.SERVER_AUTH in usages:
            raise PkiError(f"certificate of {subject!r} claims the coordinator role and a zone's key usage")
        return Role.COORDINATOR
    if ExtendedKeyUsageOID.SERVER_AUTH in usages:
        return Role.ZONE  # zones may also be TLS clients (of the reducing zone)
    if ExtendedKeyUsageOID.CLIENT_AUTH in usages:
        return Role.SITE
    raise PkiError(f"certificate of {subject!r} is neither a site (clientAuth) nor a zone (serverAuth) certificate")


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
