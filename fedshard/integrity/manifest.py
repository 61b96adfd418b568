"""Per-site, per-round manifests of released gradient shards.

A manifest lists what one site released in one round: the shard ids with their
digests and byte counts, the Merkle root over them, the shard plan it follows and the
model version the update was computed from, the digest of the residency policy the
site routed by and each shard's sensitivity class. Zones check every pushed frame
against it. It is canonical JSON; :meth:`Manifest.signing_payload` is what the site's
Ed25519 signature covers (:meth:`Manifest.signed`, :meth:`Manifest.verify_signature`).

Format 3 names the hash of its digests, Merkle root and base version (``"hash":
"blake3"``, under the signature); format 2 used SHA-256 and named none. A manifest of
another format or hash is refused whole, with code
:attr:`~fedshard.errors.RefusalCode.FORMAT`: its digests could not be checked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedshard.crypto.signing import sign, verify
from fedshard.errors import IntegrityError, RefusalCode, ShardError
from fedshard.integrity.canonical import canonical_json
from fedshard.integrity.digest import HASH_NAME, ciphertext_digest, shard_digest
from fedshard.integrity.merkle import merkle_root

__all__ = ["MANIFEST_FORMAT", "MAX_NOISE_TERMS", "Manifest", "ShardEntry", "build_manifest", "noise_terms_ok"]

MANIFEST_FORMAT = 3
"""The manifest format this version writes and accepts (3: BLAKE3 digests, named by ``"hash"``)."""

MAX_NOISE_TERMS = 512
"""The most characters of noise terms (:attr:`Manifest.noise`) a manifest or a forwarded
partial sum may carry; both DP levels' terms fit in under 300."""


def noise_terms_ok(terms: str) -> bool:
    """Whether ``terms`` may be a manifest's or partial sum's noise terms: at most
    :data:`MAX_NOISE_TERMS` printable ASCII characters (no line breaks: they end up in
    one-line refusals and audit records)."""
    return len(terms) <= MAX_NOISE_TERMS and terms.isascii() and terms.isprintable()


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One released shard: id, digest (hex), size in bytes and sensitivity class
    (empty where residency does not apply, e.g. an aggregate's listing)."""

    shard_id: str
    digest: str
    nbytes: int
    shard_class: str = ""
    encrypted: bool = False  # HE ciphertext bytes rather than the plan's dtype


@dataclass(frozen=True, slots=True)
class Manifest:
    """What one site released in one round.

    ``weight`` is the site's aggregation weight (its number of training examples).
    ``noise`` names the terms its DP noise share was made under where the noise is shared
    over several sites (:meth:`fedshard.site.privacy.RoundDP.noise_terms`; "" where it is
    not): written by the site under its signature, at most :data:`MAX_NOISE_TERMS`
    characters; a zone puts only shares of the same terms in one aggregate. The
    field is in the signed body only when set, so manifests without shared noise read and
    verify as before.
    """

    site_id: str
    round: int
    plan_digest: str
    base_version: str
    zone: str
    weight: float
    shards: tuple[ShardEntry, ...]
    merkle_root: str
    policy_digest: str = ""
    noise: str = ""
    format: int = MANIFEST_FORMAT
    signature: str | None = field(default=None, compare=False)

    @property
    def total_bytes(self) -> int:
        """Bytes of all shard values listed."""
        return sum(s.nbytes for s in self.shards)

    def entry(self, shard_id: str) -> ShardEntry | None:
        """The entry for ``shard_id``, or None if the manifest does not list it."""
        for s in self.shards:
            if s.shard_id == shard_id:
                return s
        return None

    def _body(self) -> dict[str, Any]:
        body = {
            "format": self.format,
            "hash": HASH_NAME,
            "site_id": self.site_id,
            "round": self.round,
            "plan_digest": self.plan_digest,
            "base_version": self.base_version,
            "zone": self.zone,
            "weight": self.weight,
            "shards": [[s.shard_id, s.digest, s.nbytes, s.shard_class, s.encrypted] for s in self.shards],
            "merkle_root": self.merkle_root,
            "policy_digest": self.policy_digest,
        }
        if self.noise:
            body["noise"] = self.noise
        return body

    def signing_payload(self) -> bytes:
        """Canonical bytes that a signature covers (everything but the signature)."""
        return canonical_json(self._body(), allow_nan=True)

    def to_bytes(self) -> bytes:
        """Serialise (canonical JSON, signature included)."""
        body = self._body()
        body["signature"] = self.signature
        return canonical_json(body, allow_nan=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and check a manifest; raise :class:`IntegrityError` if malformed or inconsistent."""
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise IntegrityError(f"malformed manifest: expected a JSON object, got {type(body).__name__}")
            _check_format(body)
            manifest = cls(
                site_id=str(body["site_id"]),
                round=int(body["round"]),
                plan_digest=str(body["plan_digest"]),
                base_version=str(body["base_version"]),
                zone=str(body["zone"]),
                weight=float(body["weight"]),
                shards=tuple(ShardEntry(str(s), str(d), int(n), str(c), e is True) for s, d, n, c, e in body["shards"]),
                merkle_root=str(body["merkle_root"]),
                policy_digest=str(body["policy_digest"]),
                noise=str(body.get("noise", "")),
                signature=body.get("signature"),
            )
        except IntegrityError:
            raise
        except RecursionError:
            raise IntegrityError("malformed manifest: JSON nested too deeply") from None
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(1e999)
            raise IntegrityError(f"malformed manifest: {exc}") from None
        manifest.check()
        return manifest

    def check(self) -> None:
        """Raise :class:`IntegrityError` unless the manifest is self-consistent."""
        ids = [s.shard_id for s in self.shards]
        if not ids:
            raise IntegrityError(f"manifest of site {self.site_id!r} round {self.round} lists no shards")
        if len(set(ids)) != len(ids):
            raise IntegrityError(f"manifest of site {self.site_id!r} lists a shard twice")
        if not (self.weight > 0 and np.isfinite(self.weight)):
            raise IntegrityError(f"manifest weight must be positive and finite, got {self.weight!r}")
        if not noise_terms_ok(self.noise):
            raise IntegrityError(
                f"manifest of site {self.site_id!r}: noise terms must be at most {MAX_NOISE_TERMS} printable ASCII "
                f"characters (got {len(self.noise)})"
            )
        root = merkle_root({s.shard_id: s.digest for s in self.shards})
        if root != self.merkle_root:
            raise IntegrityError(
                f"manifest of site {self.site_id!r} round {self.round}: Merkle root {self.merkle_root[:12]}… "
                f"does not match its shard list ({root[:12]}…)"
            )

    def with_signature(self, signature: str) -> Manifest:
        """Copy of this manifest carrying ``signature``."""
        return replace(self, signature=signature)

    def signed(self, private_key: Ed25519PrivateKey) -> Manifest:
        """Copy of this manifest signed with the site's Ed25519 key."""
        return self.with_signature(sign(private_key, self.signing_payload()))

    def verify_signature(self, public_key: Ed25519PublicKey | bytes | str) -> None:
        """Raise :class:`IntegrityError` unless the manifest carries a valid signature by ``public_key``."""
        if self.signature is None:
            raise IntegrityError(f"manifest of site {self.site_id!r} round {self.round} is not signed")
        if not verify(public_key, self.signing_payload(), self.signature):
            raise IntegrityError(
                f"manifest of site {self.site_id!r} round {self.round}: signature does not verify with the "
                "site's registered key (tampered, or signed by another key)"
            )


def _check_format(body: dict[str, Any]) -> None:
    """Refuse (code ``format``) a manifest of another format or hash than this version speaks."""
    found, hash_name = body.get("format"), body.get("hash")
    if found == MANIFEST_FORMAT and hash_name == HASH_NAME:
        return
    if found == 2:
        what = "manifest format 2 (SHA-256 digests, fedshard before BLAKE3)"
    elif found == MANIFEST_FORMAT:
        what = f"digest hash {hash_name!r}"
    else:
        what = f"manifest format {found!r}"
    raise IntegrityError(
        f"unsupported {what}: this version speaks manifest format {MANIFEST_FORMAT} with {HASH_NAME} digests; "
        "upgrade the site and the zone to the same fedshard release",
        code=RefusalCode.FORMAT,
    )


def build_manifest(
    *,
    site_id: str,
    round: int,
    plan_digest: str,
    base_version: str,
    zone: str,
    weight: float,
    shards: Mapping[str, np.ndarray | bytes],
    classes: Mapping[str, str] | None = None,
    policy_digest: str = "",
    encrypted: frozenset[str] = frozenset(),
    noise: str = "",
) -> Manifest:
    """Digest ``shards`` and build the manifest that describes them.

    ``classes`` gives each shard's sensitivity class, ``policy_digest`` the residency
    policy the site routed by, ``encrypted`` the shards that are HE ciphertext
    ``bytes`` (digests cover those bytes); zones re-check all three. ``noise`` names the
    terms of the site's shared noise (see :class:`Manifest`).

    Raises
    ------
    ShardError
        A shard is bytes but not listed in ``encrypted``, or listed but not ciphertext.
    """
    classes = classes or {}
    entries = []
    for sid, value in shards.items():
        digest, nbytes = _digest(sid, value, sid in encrypted)
        entries.append(ShardEntry(sid, digest, nbytes, classes.get(sid, ""), sid in encrypted))
    root = merkle_root({e.shard_id: e.digest for e in entries})
    return Manifest(
        site_id, round, plan_digest, base_version, zone, float(weight), tuple(entries), root, policy_digest, noise
    )


def _digest(shard_id: str, value: np.ndarray | bytes, encrypted: bool) -> tuple[str, int]:
    """Digest and size of one shard: its values, or its ciphertext bytes."""
    if isinstance(value, bytes):
        if not encrypted:
            raise ShardError(f"shard {shard_id} is ciphertext bytes but not listed as encrypted")
        return ciphertext_digest(value), len(value)
    if encrypted:
        raise ShardError(
            f"shard {shard_id} is listed as encrypted but holds {value.dtype} values, not ciphertext bytes"
        )
    return shard_digest(value), int(value.nbytes)
