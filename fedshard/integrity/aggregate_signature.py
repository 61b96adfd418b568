"""Aggregates signed by the zone that published them.

When a zone with a key (mutual TLS) closes a round, it signs, for every aggregate it
publishes, a statement of what the aggregate is (:class:`AggregateStatement`) with its
TLS private key (ECDSA P-256, as it signs its audit heads). The statement, the signature
and the zone's certificate (:class:`AggregateSignature`) travel with the aggregate: in
the ``FetchAggregate`` header a site reads, and in the ``CloseRound`` reply the
coordinator relays. A site applies an aggregate only when :func:`check_aggregate` says
the publishing zone signed exactly what it fetched: the certificate chains to the
federation CA and names that zone, in the region the site's own config gives it; the
statement names the round and group the site asked for and the Merkle root of the
shards it fetched and checked. So a coordinator (or anyone but the zone) can relay an
aggregate, never author one.

The signature covers ``b"fedshard aggregate v1\\n" ‖ statement``, where the statement
is canonical JSON (keys sorted, no spaces, ASCII)::

    {"contributors":{"site-a":114.0,...},"fingerprint":"<sha256 of the certificate>",
     "format":1,"group":"global","hash":"blake3","merkle_root":"9f…","region":"EU",
     "round":3,"total_weight":228.0,"zone":"eu-central"}

``contributors`` are the sites whose shards the aggregate holds, each with the weight
the round fixed for it; the certificate is bound through its fingerprint.

Stability contract: a statement never changes meaning; another layout gets another
``format`` and another domain string, and readers refuse formats they do not know.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from fedshard.crypto.identity import Role, ZoneId, ZoneKey, load_cert, read_identity
from fedshard.errors import IntegrityError, PkiError
from fedshard.integrity.canonical import canonical_json
from fedshard.integrity.digest import HASH_NAME

__all__ = [
    "MAX_CERTIFICATE_BYTES",
    "MAX_SIGNATURE_BYTES",
    "MAX_STATEMENT_BYTES",
    "STATEMENT_FORMAT",
    "AggregateSignature",
    "AggregateSigner",
    "AggregateStatement",
    "check_aggregate",
]

STATEMENT_FORMAT = 1
"""Format of the statements this code writes and reads."""
_DOMAIN = b"fedshard aggregate v1\n"  # a zone key's signature over a statement means nothing else
MAX_STATEMENT_BYTES = 8 << 20
"""Largest statement a site reads (about 40 bytes a contributor: a million sites fit)."""
MAX_CERTIFICATE_BYTES = 16 << 10
"""Largest certificate (PEM) a site reads with a statement."""
MAX_SIGNATURE_BYTES = 256
"""Largest signature a site reads (an ECDSA P-256 signature in DER is at most 72 bytes)."""


@dataclass(frozen=True, slots=True)
class AggregateStatement:
    """What a zone says of one aggregate it published.

    Attributes
    ----------
    zone, region:
        The publishing zone and its region (as its config has them).
    round, group:
        Which aggregate of which round.
    merkle_root:
        The root over the aggregate's shard digests (:data:`~fedshard.integrity.HASH_NAME`).
    total_weight:
        The aggregate's total weight, as its summary says.
    contributors:
        ``(site, weight)`` of every site whose shards it holds, sorted, with the weight
        the round fixed for it.
    fingerprint:
        SHA-256 of the signing certificate (DER), hex; empty until signed.
    """

    zone: str
    region: str
    round: int
    group: str
    merkle_root: str
    total_weight: float
    contributors: tuple[tuple[str, float], ...]
    fingerprint: str = ""

    def to_bytes(self) -> bytes:
        """The canonical JSON of the statement (what is signed, after the domain string)."""
        return _canonical(
            {
                "format": STATEMENT_FORMAT,
                "hash": HASH_NAME,
                "zone": self.zone,
                "region": self.region,
                "round": self.round,
                "group": self.group,
                "merkle_root": self.merkle_root,
                "total_weight": self.total_weight,
                "contributors": dict(self.contributors),
                "fingerprint": self.fingerprint,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> AggregateStatement:
        """Parse a statement; :class:`IntegrityError` saying what is wrong with it."""
        try:
            raw = json.loads(data, parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError):
            raise IntegrityError("the aggregate's statement is not JSON") from None
        if not isinstance(raw, dict):
            raise IntegrityError("the aggregate's statement is not a JSON object")
        if raw.get("format") != STATEMENT_FORMAT or raw.get("hash") != HASH_NAME:
            raise IntegrityError(
                f"the aggregate's statement is of format {raw.get('format')!r} over {raw.get('hash')!r}; this fedshard "
                f"reads format {STATEMENT_FORMAT} over {HASH_NAME}"
            )
        contributors = raw.get("contributors")
        if not isinstance(contributors, dict) or not all(
            isinstance(k, str) and _number(v) for k, v in contributors.items()
        ):
            raise IntegrityError("the aggregate's statement has no valid contributors")
        fields = {k: raw.get(k) for k in ("zone", "region", "group", "merkle_root", "fingerprint")}
        if not all(isinstance(v, str) for v in fields.values()):
            raise IntegrityError("the aggregate's statement lacks its zone, region, group, root or fingerprint")
        rnd, weight = raw.get("round"), raw.get("total_weight")
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0 or not isinstance(weight, int | float):
            raise IntegrityError("the aggregate's statement has no valid round or total weight")
        if not _number(weight):
            raise IntegrityError("the aggregate's statement has no valid round or total weight")
        statement = cls(
            str(fields["zone"]),
            str(fields["region"]),
            rnd,
            str(fields["group"]),
            str(fields["merkle_root"]),
            float(weight),
            tuple(sorted((k, float(v)) for k, v in contributors.items())),
            str(fields["fingerprint"]),
        )
        if statement.to_bytes() != data:
            raise IntegrityError("the aggregate's statement is not in canonical form")
        return statement

    @classmethod
    def of(
        cls,
        zone: str,
        region: str,
        round: int,
        group: str,
        merkle_root: str,
        total_weight: float,
        contributors: Mapping[str, float],
    ) -> AggregateStatement:
        """The statement of an aggregate, its contributors sorted."""
        return cls(zone, region, round, group, merkle_root, float(total_weight), tuple(sorted(contributors.items())))


@dataclass(frozen=True, slots=True)
class AggregateSignature:
    """A zone's signed statement of one aggregate, and the certificate to check it with.

    Attributes
    ----------
    statement:
        The statement, canonical JSON (:meth:`AggregateStatement.to_bytes`).
    signature:
        ECDSA-SHA256 (DER) over the domain string and the statement.
    certificate:
        The zone's certificate (PEM).
    """

    statement: bytes
    signature: bytes
    certificate: bytes

    def to_json(self) -> dict[str, str]:
        """As plain JSON values (stored with the aggregate, relayed in messages)."""
        return {
            "statement": self.statement.decode("ascii"),
            "signature": self.signature.hex(),
            "certificate": self.certificate.decode("ascii"),
        }

    @classmethod
    def from_json(cls, raw: object) -> AggregateSignature:
        """Inverse of :meth:`to_json`; :class:`IntegrityError` if ``raw`` is not one."""
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("statement", "signature")):
            raise IntegrityError("not a signed aggregate statement")
        try:
            return cls(
                str(raw["statement"]).encode("ascii"),
                bytes.fromhex(str(raw["signature"])),
                str(raw.get("certificate", "")).encode("ascii"),
            )
        except (ValueError, UnicodeEncodeError):
            raise IntegrityError("not a signed aggregate statement") from None


class AggregateSigner:
    """Signs a zone's aggregate statements with its TLS key.

    Parameters
    ----------
    key_pem, cert_pem:
        The zone's private key (PEM, elliptic curve) and certificate.

    Raises
    ------
    PkiError
        The key or certificate cannot be read, or they do not belong together.
    """

    def __init__(self, key_pem: bytes, cert_pem: bytes) -> None:
        self._key = ZoneKey(key_pem, cert_pem)
        self.certificate = self._key.certificate_pem
        self.fingerprint = self._key.fingerprint

    def sign(self, statement: AggregateStatement) -> AggregateSignature:
        """Sign ``statement`` (its fingerprint set to this zone's certificate)."""
        data = replace(statement, fingerprint=self.fingerprint).to_bytes()
        signature = self._key.sign(_DOMAIN + data)
        return AggregateSignature(data, signature, self.certificate)


def check_aggregate(
    signed: AggregateSignature | None,
    ca_pem: bytes,
    zone: ZoneId,
    *,
    round: int,
    group: str,
    merkle_root: str,
    total_weight: float,
    sites: Sequence[str],
    now: datetime | None = None,
) -> AggregateStatement:
    """Check that ``zone`` signed exactly this aggregate; the statement.

    Parameters
    ----------
    signed:
        What came with the aggregate (None: nothing).
    ca_pem:
        The federation CA.
    zone:
        The zone that published it, name and region as the checking party's own config has them.
    round, group:
        The aggregate asked for.
    merkle_root, total_weight, sites:
        What the fetched aggregate's summary says, its shards already checked against the root.
    now:
        When to check the certificate's validity (default: now).

    Raises
    ------
    IntegrityError
        One line naming the aggregate and what fails: no signature, a certificate that
        is not ``zone``'s (or not the CA's), a statement of another aggregate, a bad signature.
    """
    where = f"aggregate {group} of round {round} from {zone}"
    if signed is None or not signed.statement:
        raise IntegrityError(f"{where} is not signed by the zone: refusing to apply it")
    if (
        len(signed.statement) > MAX_STATEMENT_BYTES
        or len(signed.certificate) > MAX_CERTIFICATE_BYTES
        or len(signed.signature) > MAX_SIGNATURE_BYTES
    ):
        raise IntegrityError(f"{where}: its signature is larger than any a zone writes: refusing to apply it")
    try:
        holder = read_identity(signed.certificate, ca_pem, now=now)
    except PkiError as exc:
        raise IntegrityError(f"{where}: the signing certificate fails the federation's checks ({exc})") from None
    if holder.role is not Role.ZONE or (holder.name, holder.jurisdiction_or_region) != (zone.name, zone.region):
        raise IntegrityError(f"{where} is signed by {holder}, not by the zone: refusing to apply it")
    statement = AggregateStatement.from_bytes(signed.statement)
    if statement.fingerprint != holder.fingerprint:
        raise IntegrityError(f"{where}: the statement names another certificate than the one that came with it")
    public = load_cert(signed.certificate, "zone certificate").public_key()
    try:
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise InvalidSignature
        public.verify(signed.signature, _DOMAIN + signed.statement, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise IntegrityError(f"{where}: the zone's signature does not verify: refusing to apply it") from None
    expected = AggregateStatement(
        zone.name,
        zone.region,
        round,
        group,
        merkle_root,
        float(total_weight),
        statement.contributors,
        statement.fingerprint,
    )
    if statement != expected or sorted(sites) != [site for site, _ in statement.contributors]:
        raise IntegrityError(f"{where}: the zone signed {_describe(statement)}, not what was fetched")
    return statement


def _describe(s: AggregateStatement) -> str:
    return (
        f"aggregate {s.group} of round {s.round} by zone {s.zone} ({s.region}) with root {s.merkle_root[:12]}…, "
        f"weight {s.total_weight:g} and {len(s.contributors)} contributor(s)"
    )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _canonical(value: Any) -> bytes:
    return canonical_json(value)
