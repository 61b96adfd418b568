"""A zone's signature over the head of its audit chain, kept in a file next to the log.

The hash chain of :mod:`fedshard.audit` shows any change *inside* the log,
but anyone who can write the file can append records with a valid chain, or cut
records off its end. So after every append the zone signs its chain head with its
TLS key (the key of ``fedshard zone up --key``) and replaces ``audit.head.json``
(for ``audit.jsonl``) atomically with one canonical JSON object::

    {"version":1,"lines":42,"head":"9f…","zone":"eu-1","time":1700000000.5,
     "fingerprint":"<sha256 of the certificate, hex>","cert":"-----BEGIN CERTIFICATE-----…",
     "signature":"<ECDSA-SHA256, DER, hex>"}

The signature covers ``b"fedshard audit head v1\\n" ‖ canonical JSON of version,
lines, head, zone, time, fingerprint`` (the certificate is bound through its
fingerprint). A verifier then knows that the zone's chain had ``lines`` records
ending in ``head``: records after line ``lines`` were not written by the zone, and a
log with fewer lines lost its tail.

Stability contract: a stored head never changes meaning; a new format gets a new
``version`` and a new domain string, and readers refuse versions they do not know.

:class:`HeadSigner` signs (the zone), :class:`HeadVerifier` checks (an auditor),
optionally against a pinned certificate and/or the federation CA.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedshard.crypto.identity import (
    Identity,
    Role,
    ZoneKey,
    certificate_fingerprint,
    claimed_identity,
    load_cert,
    read_identity,
    read_pem,
)
from fedshard.errors import PkiError
from fedshard.integrity.canonical import canonical_json

__all__ = [
    "HEAD_VERSION",
    "HeadFile",
    "HeadSignature",
    "HeadSigner",
    "HeadVerifier",
    "SignedHead",
    "head_path",
    "read_head",
    "write_head",
]

HEAD_VERSION = 1
"""Version of the signed-head format written by this code."""
_DOMAIN = b"fedshard audit head v1\n"  # keeps a head signature from meaning anything else signed by the zone key
_FILE_MODE = 0o640
_HEX = frozenset("0123456789abcdef")


def head_path(log: str | os.PathLike[str]) -> Path:
    """Where the signed head of the log at ``log`` lives: ``audit.jsonl`` → ``audit.head.json``."""
    p = Path(log)
    stem = p.name[: -len(".jsonl")] if p.name.endswith(".jsonl") else p.name
    return p.with_name(f"{stem}.head.json")


@dataclass(frozen=True)
class SignedHead:
    """The zone's statement "my audit chain has ``lines`` records and ends in ``head``", signed.

    Attributes
    ----------
    lines, head:
        Number of records and hash of the last one (``"0" * 64`` for none).
    zone:
        The signing zone's name (the certificate's CN).
    time:
        When it was signed (seconds since the epoch).
    fingerprint:
        SHA-256 of the signing certificate (DER), hex.
    cert:
        The signing certificate (PEM text), so that a CA alone suffices to check it.
    signature:
        ECDSA-SHA256 over :meth:`payload`, DER, hex.
    """

    lines: int
    head: str
    zone: str
    time: float
    fingerprint: str
    cert: str
    signature: str

    def _signed(self) -> dict[str, Any]:
        return {
            "version": HEAD_VERSION,
            "lines": self.lines,
            "head": self.head,
            "zone": self.zone,
            "time": self.time,
            "fingerprint": self.fingerprint,
        }

    def payload(self) -> bytes:
        """The bytes the signature covers."""
        return _DOMAIN + _canonical(self._signed())

    def to_json(self) -> bytes:
        """The head file's content (canonical JSON, one line)."""
        return _canonical({**self._signed(), "cert": self.cert, "signature": self.signature}) + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> SignedHead:
        """Parse a head file; :class:`ValueError` saying what is wrong with it."""
        try:
            raw = json.loads(data)
        except ValueError:
            raise ValueError("is not valid JSON") from None
        if not isinstance(raw, dict):
            raise ValueError("is not a JSON object")
        if raw.get("version") != HEAD_VERSION:
            raise ValueError(f"has version {raw.get('version')!r}; this fedshard reads version {HEAD_VERSION}")
        lines, when = raw.get("lines"), raw.get("time")
        if not isinstance(lines, int) or isinstance(lines, bool) or lines < 0:
            raise ValueError("has no valid line count")
        if not isinstance(when, int | float) or isinstance(when, bool):
            raise ValueError("has no valid time")
        for name, size in (("head", 64), ("fingerprint", 64), ("signature", None)):
            value = raw.get(name)
            if not isinstance(value, str) or not value or not set(value) <= _HEX or (size and len(value) != size):
                raise ValueError(f"has no valid {name}")
        if not isinstance(raw.get("zone"), str) or not isinstance(raw.get("cert"), str):
            raise ValueError("has no zone or certificate")
        return cls(lines, raw["head"], raw["zone"], float(when), raw["fingerprint"], raw["cert"], raw["signature"])


class HeadSigner:
    """Signs audit heads with a zone's TLS key.

    Parameters
    ----------
    key_pem:
        The zone's private key (PEM, elliptic curve: what ``fedshard pki issue-zone`` writes).
    cert_pem:
        The zone's certificate; its public key must be the key's.

    Raises
    ------
    PkiError
        The key or certificate cannot be read, or they do not belong together.
    """

    def __init__(self, key_pem: bytes, cert_pem: bytes) -> None:
        self._key = ZoneKey(key_pem, cert_pem)
        self._cert_text = self._key.certificate_pem.decode("ascii")
        self.zone = _common_name(self._key.certificate)
        self.fingerprint = self._key.fingerprint

    @classmethod
    def from_files(cls, key: str | os.PathLike[str], cert: str | os.PathLike[str]) -> HeadSigner:
        """A signer from the zone's key and certificate files."""
        return cls(read_pem(key), read_pem(cert))

    def sign(self, lines: int, head: str, when: float) -> SignedHead:
        """Sign "the chain has ``lines`` records ending in ``head``" at time ``when``."""
        unsigned = SignedHead(lines, head, self.zone, float(when), self.fingerprint, self._cert_text, "")
        signature = self._key.sign(unsigned.payload())
        return SignedHead(lines, head, self.zone, float(when), self.fingerprint, self._cert_text, signature.hex())


@dataclass(frozen=True)
class HeadSignature:
    """Who signed a head that verified.

    Attributes
    ----------
    zone, fingerprint:
        The signing zone and its certificate's SHA-256.
    lines, time:
        How many records the head covers, and when it was signed.
    trusted:
        Whether the certificate was checked against a pinned certificate or the
        federation CA; ``False`` means only that the head file is self-consistent
        (anyone can make such a file with a key of their own).
    holder:
        Whom the signing certificate names (role, name, region): as the CA vouched for
        it when a CA was given, as the pinned certificate says otherwise; None when
        neither was given.
    """

    zone: str
    fingerprint: str
    lines: int
    time: float
    trusted: bool
    holder: Identity | None = None


class HeadVerifier:
    """Checks a :class:`SignedHead`.

    Parameters
    ----------
    cert_pem:
        The zone's certificate, pinned: the head must be signed by its key.
    ca_pem:
        The federation CA: the signing certificate (pinned, or else the one in the
        head file) must be a zone certificate it issued, valid when the head was signed.

    With neither, a signature is checked against the certificate in the head file
    only, and :attr:`HeadSignature.trusted` is ``False``.
    """

    def __init__(self, cert_pem: bytes | None = None, ca_pem: bytes | None = None) -> None:
        self._cert = load_cert(cert_pem, "zone certificate") if cert_pem is not None else None
        self._cert_pem = cert_pem
        self._ca_pem = ca_pem
        if ca_pem is not None:
            load_cert(ca_pem, "CA certificate")

    @classmethod
    def from_files(
        cls, cert: str | os.PathLike[str] | None = None, ca: str | os.PathLike[str] | None = None
    ) -> HeadVerifier:
        """A verifier from certificate files (either may be ``None``)."""
        return cls(read_pem(cert) if cert is not None else None, read_pem(ca) if ca is not None else None)

    @property
    def anchored(self) -> bool:
        """Whether a pinned certificate or a CA was given (a signature then means something)."""
        return self._cert is not None or self._ca_pem is not None

    def check(self, head: SignedHead) -> HeadSignature:
        """Verify ``head``'s signature and certificate.

        Raises
        ------
        PkiError
            The signature does not verify, or the certificate is not the pinned one,
            not issued by the CA, or not the named zone's; the message says which.
        """
        try:
            embedded = load_cert(head.cert.encode("ascii"), "certificate in the head file")
        except UnicodeEncodeError:
            raise PkiError("the certificate in the head file is not PEM") from None
        if certificate_fingerprint(embedded) != head.fingerprint:
            raise PkiError("the certificate in the head file does not match the fingerprint the head names")
        cert = embedded
        if self._cert is not None:
            cert = self._cert
            if certificate_fingerprint(cert) != head.fingerprint:
                raise PkiError(
                    f"the head is signed by certificate {head.fingerprint[:16]}…, "
                    f"not by the given one {certificate_fingerprint(cert)[:16]}…"
                )
        if _common_name(cert) != head.zone:
            raise PkiError(f"the head names zone {head.zone!r} but its certificate is {_common_name(cert)!r}'s")
        pem = cert.public_bytes(serialization.Encoding.PEM)
        holder = None
        if self._ca_pem is not None:
            holder = read_identity(pem, self._ca_pem, now=datetime.fromtimestamp(head.time, UTC))
        elif self._cert is not None:
            holder = claimed_identity(pem)
        if holder is not None and holder.role is not Role.ZONE:
            raise PkiError(f"the head is signed with the certificate of {holder}, not a zone's")
        public = cert.public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise PkiError("the signing certificate does not hold an elliptic-curve key")
        try:
            public.verify(bytes.fromhex(head.signature), head.payload(), ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            raise PkiError(
                f"the head's signature does not verify under zone {head.zone!r}'s certificate: "
                "the head file was altered or signed with another key"
            ) from None
        return HeadSignature(head.zone, head.fingerprint, head.lines, head.time, self.anchored, holder)


def read_head(path: Path) -> SignedHead | None:
    """The signed head in ``path``; ``None`` if there is none; :class:`ValueError` if it is malformed.

    Raises
    ------
    OSError
        The file exists but cannot be read.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return SignedHead.from_json(data)


def write_head(path: Path, head: SignedHead) -> None:
    """Replace ``path`` with ``head`` atomically (written under a temporary name, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
    try:
        _write_at(fd, head.to_json())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class HeadFile:
    """The head file a zone rewrites after every append.

    Replaced atomically once when opened, then rewritten in place through one open
    descriptor, padded with spaces to its longest length so no byte of an older
    head survives. Creating or truncating a file per append would cost about
    140 µs on ext4 (it flushes the data on rename or truncate); this costs about
    1 µs. Not fsynced per append: the log's own ``fsync`` makes each record durable,
    and a head lost in a crash shows as lines the zone adopts when it reopens the log.

    Raises
    ------
    OSError
        The file cannot be written.
    """

    def __init__(self, path: Path, first: SignedHead) -> None:
        self.path = path
        data = first.to_json()
        write_head(path, first)
        self._fd = os.open(path, os.O_WRONLY)
        self._size = len(data)

    def write(self, head: SignedHead) -> None:
        """Overwrite the file with ``head``."""
        data = head.to_json()
        padded = data + b" " * (self._size - len(data))
        _write_at(self._fd, padded)
        self._size = len(padded)

    def close(self, *, durable: bool) -> None:
        """Close the file; with ``durable``, ``fsync`` it first (once, at the end)."""
        try:
            if durable:
                os.fsync(self._fd)
        finally:
            os.close(self._fd)


def _write_at(fd: int, data: bytes) -> None:
    view, offset = memoryview(data), 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)


def _canonical(value: Any) -> bytes:
    return canonical_json(value)


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    value = names[0].value if len(names) == 1 else None
    if not isinstance(value, str) or not value:
        raise PkiError("the zone certificate has no single common name naming the zone")
    return value
