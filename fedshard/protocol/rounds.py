"""Round-level data shared by coordinator, sites and zones (metadata only)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedshard.errors import IntegrityError, RefusalCode
from fedshard.integrity.aggregate_signature import AggregateSignature
from fedshard.integrity.canonical import canonical_json
from fedshard.integrity.digest import HASH_NAME
from fedshard.integrity.manifest import ShardEntry
from fedshard.residency.router import DEFAULT_GROUP, GLOBAL_GROUP, AggregateKey

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_WEIGHT",
    "GLOBAL_GROUP",
    "Aggregate",
    "AggregateKey",
    "AggregateSummary",
    "PartialEntry",
    "PartialSum",
    "PushReceipt",
    "RoundSpec",
    "ShardPayload",
    "derive_seed",
]

ShardPayload = np.ndarray | bytes
"""One shard as it travels between site and zone: its values, or, where its header
(manifest entry, partial-sum entry, aggregate entry) says ``encrypted``, the HE
ciphertext ``bytes`` (length-prefixed ciphertexts, see :mod:`fedshard.crypto.he`)."""


DEFAULT_WEIGHT = 1.0
"""The weight of a selected site that a :class:`RoundSpec`'s ``weights`` does not name."""


@dataclass(frozen=True, slots=True)
class RoundSpec:
    """What a zone needs to accept pushes for one round.

    ``token`` is a fresh random value per round; a push must present it, so a push
    recorded in an earlier round cannot be replayed into this one.

    ``weights`` holds ``(site, weight)``: the aggregation weight the coordinator fixed for
    each selected site when it opened the round (its reported number of examples,
    capped by ``aggregation.max_site_weight``); a site it does not name weighs
    :data:`DEFAULT_WEIGHT`. A zone refuses a manifest whose weight differs, so no site
    chooses its own weight.
    """

    round: int
    token: str
    plan_json: str
    base_version: str
    sites: tuple[str, ...]
    base_versions: tuple[tuple[str, str], ...] = ()  # (site, version) where it differs from base_version
    weights: tuple[tuple[str, float], ...] = ()  # (site, weight) fixed by the coordinator
    # Lookups over the tuples above, built once (a zone asks per push; 10,000 sites would make a scan quadratic).
    _selected: frozenset[str] = field(init=False, repr=False, compare=False)
    _versions: dict[str, str] = field(init=False, repr=False, compare=False)
    _weights: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_selected", frozenset(self.sites))
        object.__setattr__(self, "_versions", dict(self.base_versions))
        object.__setattr__(self, "_weights", dict(self.weights))

    def selects(self, site_id: str) -> bool:
        """Whether the round selected ``site_id``."""
        return site_id in self._selected

    def version_for(self, site_id: str) -> str:
        """The model version ``site_id``'s update must start from (sites in different
        residency groups hold different models)."""
        return self._versions.get(site_id, self.base_version)

    def weight_for(self, site_id: str) -> float:
        """The aggregation weight the round fixed for ``site_id``."""
        return self._weights.get(site_id, DEFAULT_WEIGHT)


@dataclass(frozen=True, slots=True)
class PushReceipt:
    """A zone's acknowledgement that a whole push was validated and counted."""

    zone: str
    round: int
    site_id: str
    shards: int
    bytes: int
    fold_s: float = 0.0  # seconds the zone took to fold the push into the round's sums


@dataclass(frozen=True, slots=True)
class AggregateSummary:
    """What a zone published when it closed a round.

    ``shards`` lists the aggregate shards with their digests; ``merkle_root`` is the
    root over them, which feeds the model-version chain. ``signature`` is the publishing
    zone's signed statement of it (None from a zone without a key; see
    :mod:`fedshard.integrity.aggregate_signature`).
    """

    zone: str
    round: int
    merkle_root: str
    total_weight: float
    sites: tuple[str, ...]
    shards: tuple[ShardEntry, ...]
    group: str = DEFAULT_GROUP
    signature: AggregateSignature | None = None

    @property
    def key(self) -> AggregateKey:
        """``(zone, group)``: which aggregate this is."""
        return AggregateKey(self.zone, self.group)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Aggregate:
    """A published aggregate as a zone serves it: its summary, the weighted means of its
    clear shards, and the encrypted sums of the others (sites divide after decrypting).

    ``summary.shards`` lists every shard once, ``encrypted`` exactly for the ones in
    ``ciphertexts``.
    """

    summary: AggregateSummary
    means: Mapping[str, np.ndarray] = field(default_factory=dict)
    ciphertexts: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of its shards (values or ciphertexts), as its summary lists them."""
        return sum(e.nbytes for e in self.summary.shards)

    def payload(self) -> dict[str, ShardPayload]:
        """Every shard, in the summary's order: values, or ciphertext bytes."""
        return {
            e.shard_id: self.ciphertexts[e.shard_id] if e.encrypted else self.means[e.shard_id]
            for e in self.summary.shards
        }


@dataclass(frozen=True, slots=True)
class PartialEntry:
    """One forwarded partial sum: ``Σ (w/unit)·x`` (float32 or float64, digest over its
    bytes; ``unit`` is the round's largest fixed weight), ``Σ w``, and the sites whose
    shards it contains."""

    shard_id: str
    digest: str
    nbytes: int
    weight: float
    contributors: tuple[str, ...]
    encrypted: bool = False  # HE ciphertext sum (bytes) instead of Σ (w/unit)·x


@dataclass(frozen=True, slots=True)
class PartialSum:
    """What a zone forwards to the reducing zone when it closes a round.

    Its header names the hash of its digests (``"hash"``, :data:`~fedshard.integrity.HASH_NAME`);
    a header naming another, or none (a zone from before BLAKE3), is refused with code
    :attr:`~fedshard.errors.RefusalCode.FORMAT`.
    """

    zone: str
    round: int
    token: str
    entries: tuple[PartialEntry, ...] = ()
    noise: str = ""
    """The noise terms every encrypted share in the sums was made under (the
    :attr:`~fedshard.integrity.Manifest.noise` most of the forwarding zone's sites named; the
    other sites' shares are not forwarded; "": no shared noise). The reducing zone counts the
    sites into its lane of these terms (:meth:`~fedshard.zone._state.OpenRound.settle`). At most
    :data:`~fedshard.integrity.MAX_NOISE_TERMS` characters (checked by the reducing zone)."""

    def to_bytes(self) -> bytes:
        """Canonical JSON (``noise`` only where set)."""
        body: dict[str, object] = {
            "hash": HASH_NAME,
            "zone": self.zone,
            "round": self.round,
            "token": self.token,
            "entries": [
                [e.shard_id, e.digest, e.nbytes, e.weight, list(e.contributors), e.encrypted] for e in self.entries
            ],
        }
        if self.noise:
            body["noise"] = self.noise
        return canonical_json(body, allow_nan=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> PartialSum:
        """Parse; raise :class:`IntegrityError` if malformed."""
        try:
            body = json.loads(data)
            if isinstance(body, dict) and body.get("hash") != HASH_NAME:
                raise IntegrityError(
                    f"unsupported digest hash {body.get('hash', 'sha256 (unnamed)')!r} in a partial sum header: "
                    f"this zone speaks {HASH_NAME}; upgrade the zones to the same fedshard release",
                    code=RefusalCode.FORMAT,
                )
            entries = tuple(
                PartialEntry(str(s), str(d), int(n), float(w), tuple(str(c) for c in cs), e is True)
                for s, d, n, w, cs, e in body["entries"]
            )
            noise = str(body.get("noise", ""))
            return cls(str(body["zone"]), int(body["round"]), str(body["token"]), entries, noise)
        except IntegrityError:
            raise
        except RecursionError:
            raise IntegrityError("malformed partial sum header: JSON nested too deeply") from None
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(1e999)
            raise IntegrityError(f"malformed partial sum header: {exc}") from None


def derive_seed(*parts: object) -> int:
    """A 31-bit seed derived from ``parts`` (stable across processes and platforms)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
