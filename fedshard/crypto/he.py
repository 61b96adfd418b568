"""CKKS homomorphic encryption of gradient shards, sized for sums only (TenSEAL).

Zones only ever *add* encrypted shards, so the scheme needs multiplicative depth 0.
fedshard therefore uses a small ring and packs two quantised values into every slot:

* **Parameters**: ring degree N = 4096, coefficient modulus [60, 49] bits (109 bits,
  the 128-bit-security bound of the HE standard for N = 4096), 2048 slots per
  ciphertext, encoding scale 2^20. The 49-bit prime only serves key switching, which
  sums never need; TenSEAL requires it to exist.
* **Packing**: a site multiplies its update by ``weight / weight_scale`` (≤ 1), clips
  it to ``[-value_range, value_range]`` and quantises it with step
  ``value_range / (2^(18 - headroom) - 1)``, where ``headroom = ceil(log2(max_sites))``
  keeps the sum of up to ``max_sites`` sites from overflowing a 19-bit field. Two such
  integers travel in one slot as ``a + b·2^19`` (< 2^38 in magnitude, so slot × scale
  stays below the 60-bit data prime); the last slot of every *pack* carries the weight
  itself, in fixed point. CKKS adds slots exactly up to its noise (≈ 0.03 at scale
  2^20 for 64 fresh ciphertexts), far below the 0.5 that rounding to the nearest
  integer tolerates, so the decrypted *sums* are exact integers; the only error is
  quantisation: at most ``step / 2`` per value and site.
* **Packs** (:func:`pack_layout`): the small shards a site sends to one zone and
  aggregate group share one run of ciphertexts and one weight slot, laid out from the
  plan and the routing only, so every site packs alike and zones add packs slot-wise;
  a shard that fills whole ciphertexts no longer spills its weight into another one.
* **Encryption** is symmetric (with the secret key, which every site holds): twice as
  fast as public-key encryption, and the ciphertexts add the same way.
* **Cost**: one 65.7 kB ciphertext per 4096 values, i.e. 4.0× the bytes of float32
  (a one-value-per-slot N = 8192 [60, 40, 40] scheme is ~14×);
  :func:`encrypted_nbytes` gives the exact bytes of any shard or pack sizes.

Threat model: every site holds the same secret context; zones get a public context
that has no secret key (and no Galois or relinearisation keys), so a zone, or anyone
who breaches it, learns nothing from what it aggregates. A site that colludes with a
zone can decrypt another site's individual update; differential privacy still bounds
what that reveals.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.crypto.ciphertexts import framed, split, tenseal
from fedshard.crypto.key_files import CERT_MODE, KEY_MODE, write_files
from fedshard.errors import ConfigError, IntegrityError

if TYPE_CHECKING:
    import tenseal as ts

__all__ = [
    "PACK_SLOTS",
    "PUBLIC_CONTEXT_FILE",
    "SECRET_CONTEXT_FILE",
    "CKKS_DTYPE",
    "HeCodec",
    "Pack",
    "he_init",
    "encrypted_nbytes",
    "load_context",
    "pack_layout",
    "slots_for",
]

SECRET_CONTEXT_FILE = "secret.ctx"
PUBLIC_CONTEXT_FILE = "public.ctx"
CKKS_DTYPE = "ckks"
"""The ``dtype`` label of encrypted shards on the wire and in manifests."""

POLY_DEGREE = 4096
COEFF_BITS = (60, 49)
SCALE_BITS = 20
SLOTS = POLY_DEGREE // 2
FIELD_BITS = 19
VALUES_PER_SLOT = 2
WEIGHT_BITS = 30  # fixed-point bits of the weight slot
PACK_SLOTS = 256 * SLOTS
"""A pack grows to at most this many slots (256 ciphertexts, ~16.8 MB) unless one shard needs more."""


def _context() -> Any:
    """A fresh secret context of this module's scheme (not yet serialised)."""
    ts = tenseal()
    # Symmetric (secret-key) encryption: every site holds the secret key anyway, and it
    # encrypts twice as fast as public-key encryption; ciphertexts add the same way.
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        POLY_DEGREE,
        coeff_mod_bit_sizes=list(COEFF_BITS),
        encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC,
    )
    ctx.global_scale = 2**SCALE_BITS
    return ctx


def he_init(out: str | os.PathLike[str], *, force: bool = False) -> tuple[Path, Path]:
    """Create the federation's CKKS contexts: ``secret.ctx`` (sites, ``0600``) and
    ``public.ctx`` (zones: no secret key, no Galois or relinearisation keys)."""
    ctx = _context()
    secret = ctx.serialize(save_secret_key=True, save_galois_keys=False, save_relin_keys=False)
    public = ctx.serialize(save_secret_key=False, save_galois_keys=False, save_relin_keys=False)
    out = Path(out)
    paths = (out / SECRET_CONTEXT_FILE, out / PUBLIC_CONTEXT_FILE)
    write_files([(paths[0], secret, KEY_MODE), (paths[1], public, CERT_MODE)], force)
    return paths


def load_context(path: str | os.PathLike[str], *, secret: bool) -> ts.Context:
    """Load a context; ``secret=True`` requires the secret key, ``False`` refuses it.

    Raises
    ------
    ConfigError
        The file is missing or not a CKKS context, a site is given the public context,
        or a zone the secret one (it must never hold the key).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read CKKS context {path}: {exc.strerror or exc}") from None
    try:
        ctx = tenseal().context_from(data)
    except Exception:  # TenSEAL raises plain exceptions for malformed input
        raise ConfigError(f"{path} is not a CKKS context (make one with `fedshard keys he-init`)") from None
    if not _is_ours(ctx):
        raise ConfigError(f"{path} is not a context of fedshard's CKKS scheme (make one with `fedshard keys he-init`)")
    if secret and not ctx.has_secret_key():
        raise ConfigError(f"{path} has no secret key: sites need {SECRET_CONTEXT_FILE}")
    if not secret and ctx.has_secret_key():
        raise ConfigError(f"{path} holds the secret key: zones must be given {PUBLIC_CONTEXT_FILE}, never the secret")
    return ctx


def _is_ours(ctx: Any) -> bool:
    """True if ``ctx`` has this module's scheme and parameters (CKKS, N, modulus bits, scale)."""
    try:
        data = ctx.seal_context().data
        parms = data.key_context_data().parms()
        return bool(
            parms.scheme() == tenseal().SCHEME_TYPE.CKKS.value
            and parms.poly_modulus_degree() == POLY_DEGREE
            and data.key_context_data().total_coeff_modulus_bit_count() == sum(COEFF_BITS)
            and data.first_context_data().total_coeff_modulus_bit_count() == COEFF_BITS[0]
            and ctx.global_scale == 2**SCALE_BITS
        )
    except Exception:  # TenSEAL's bindings raise plain exceptions (a BFV context has no scale)
        return False


def _headroom(max_sites: int) -> int:
    return max(1, math.ceil(math.log2(max(2, max_sites))))


@dataclass(frozen=True)
class Pack:
    """Encrypted shards that share one run of ciphertexts (and one weight slot).

    The first member, the *carrier*, travels as the pack's ciphertext bytes; every
    other member travels as empty bytes, listed in the manifest like any shard. Values
    are laid out member after member, two per slot, then the weight slot.
    """

    members: tuple[tuple[str, int], ...]
    """(shard id, value count) in plan order."""

    @property
    def carrier(self) -> str:
        """The member whose bytes are the pack's ciphertexts."""
        return self.members[0][0]

    @property
    def count(self) -> int:
        """Values in the pack."""
        return sum(n for _, n in self.members)

    @property
    def ciphertexts(self) -> int:
        """Ciphertexts the pack takes."""
        return ciphertexts_for(self.count)


def pack_layout(shards: Iterable[tuple[str, int, str]]) -> list[Pack]:
    """Deterministic packing of ``(shard id, value count, key)`` given in plan order.

    Only shards of equal ``key`` share a pack (callers key by destination zone and
    shard class, so a pack never mixes aggregate groups); in plan order, a shard joins
    the latest pack of its key while the pack stays within :data:`PACK_SLOTS` slots,
    else starts a new one. The layout depends on the plan and the routing only, never
    on values, so every site packs alike and zones add packs slot-wise. Packs end on a
    weight slot: one per pack instead of one per shard, so a shard that fills whole
    ciphertexts no longer spills its weight into another one.
    """
    open_packs: dict[str, list[tuple[str, int]]] = {}
    done: list[tuple[int, Pack]] = []  # (position of the first member, pack)
    first: dict[str, int] = {}
    for position, (sid, count, key) in enumerate(shards):
        current = open_packs.get(key)
        if current and slots_for(sum(n for _, n in current) + count) > PACK_SLOTS:
            done.append((first[key], Pack(tuple(current))))
            current = None
        if not current:
            current = open_packs[key] = []
            first[key] = position
        current.append((sid, count))
    done += [(first[key], Pack(tuple(members))) for key, members in open_packs.items() if members]
    return [pack for _, pack in sorted(done, key=lambda item: item[0])]


@dataclass(frozen=True)
class HeCodec:
    """Packs, encrypts and decrypts shards (see the module docstring).

    Parameters
    ----------
    context:
        A TenSEAL context: with the secret key to encrypt and decrypt (sites).
    value_range:
        Weighted values are clipped to ``[-value_range, value_range]``.
    max_sites:
        Most contributions one sum may hold.
    """

    context: Any
    value_range: float = 1.0
    max_sites: int = 16

    @property
    def levels(self) -> int:
        """Largest quantised magnitude of one site's value."""
        return int(2 ** (FIELD_BITS - _headroom(self.max_sites) - 1) - 1)

    @property
    def step(self) -> float:
        """Quantisation step: the error bound per value and site is half of it."""
        return self.value_range / self.levels

    def slots_for(self, count: int) -> int:
        """Slots a shard of ``count`` values takes (the weight slot included)."""
        return slots_for(count)

    def encode(self, values: np.ndarray, weight: float) -> tuple[np.ndarray, int]:
        """Slots (float64 integers) for ``weight · values``, and how many values were clipped.

        ``weight`` must be in (0, 1]: callers divide by a weight scale known to all.
        """
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1] (divide by the federation's weight scale), got {weight}")
        flat = np.asarray(values, dtype=np.float64).reshape(-1) * weight
        clipped = int(np.count_nonzero(np.abs(flat) > self.value_range))
        q = np.rint(np.clip(flat, -self.value_range, self.value_range) / self.step).astype(np.int64)
        if q.size % 2:
            q = np.append(q, 0)
        pairs = q.reshape(-1, 2)
        slots = pairs[:, 0].astype(np.float64) + pairs[:, 1].astype(np.float64) * float(2**FIELD_BITS)
        weight_slot = float(round(weight * 2**WEIGHT_BITS))
        return np.append(slots, weight_slot), clipped

    def encrypt(self, values: np.ndarray, weight: float) -> tuple[bytes, int]:
        """Ciphertext bytes of ``weight · values`` (length-prefixed ciphertexts), and the clip count."""
        slots, clipped = self.encode(values, weight)
        return b"".join(
            _encrypt_slots(self.context, slots[i : i + SLOTS]) for i in range(0, slots.size, SLOTS)
        ), clipped

    def encrypt_many(
        self, shards: Mapping[str, np.ndarray], weight: float, workers: int | None = None
    ) -> tuple[dict[str, bytes], int]:
        """Encrypt several shards; returns ciphertexts by shard id and the clip count.

        Packing runs here (vectorised); with enough values (≥ 1 M) the ciphertexts are
        made on ``workers`` processes (default: every core), one ciphertext-sized piece
        per job, so one large shard keeps every core busy. The pool lives as long as
        this process.
        """
        workers = workers or os.cpu_count() or 1
        encoded = {sid: self.encode(v, weight) for sid, v in shards.items()}
        clipped = sum(n for _, n in encoded.values())
        pieces = [
            (sid, slots[i : i + SLOTS]) for sid, (slots, _) in encoded.items() for i in range(0, slots.size, SLOTS)
        ]
        if workers < 2 or len(pieces) * SLOTS * VALUES_PER_SLOT < _PARALLEL_VALUES:
            blobs = [_encrypt_slots(self.context, piece) for _, piece in pieces]
        else:
            pool = _pool(self.context, workers)
            batch = max(1, len(pieces) // (4 * workers))
            blobs = list(pool.map(_encrypt_in_worker, [piece for _, piece in pieces], chunksize=batch))
        out: dict[str, list[bytes]] = {sid: [] for sid in shards}
        for (sid, _), blob in zip(pieces, blobs, strict=True):
            out[sid].append(blob)
        return {sid: b"".join(parts) for sid, parts in out.items()}, clipped

    def encrypt_packs(
        self, packs: Sequence[Pack], shards: Mapping[str, np.ndarray], weight: float, workers: int | None = None
    ) -> tuple[dict[str, bytes], int]:
        """Encrypt ``packs`` of ``shards``: the carriers' ciphertexts, the other members'
        empty bytes, by shard id; and the clip count."""
        joined = {
            p.carrier: np.concatenate([np.asarray(shards[sid]).reshape(-1) for sid, _ in p.members]) for p in packs
        }
        blobs, clipped = self.encrypt_many(joined, weight, workers)
        out = {sid: b"" for p in packs for sid, _ in p.members}
        out.update(blobs)
        return out, clipped

    def decrypt_pack(self, data: bytes, pack: Pack) -> dict[str, np.ndarray]:
        """The weighted means of ``pack``'s members (flat), from the carrier's encrypted sum."""
        mean = self.decrypt_mean(data, pack.count)
        out, pos = {}, 0
        for sid, count in pack.members:
            out[sid] = mean[pos : pos + count]
            pos += count
        return out

    def decrypt_mean(self, data: bytes, count: int) -> np.ndarray:
        """The weighted mean of the ``count`` values whose encrypted sum is ``data``."""
        ts = tenseal()
        slots = np.concatenate([np.asarray(ts.ckks_vector_from(self.context, b).decrypt()) for b in split(data)])
        needed = self.slots_for(count)
        if slots.size < needed:
            raise IntegrityError(f"encrypted shard holds {slots.size} slots, {needed} expected")
        ints = np.rint(slots[:needed]).astype(np.int64)
        total_weight = float(ints[-1]) / 2**WEIGHT_BITS
        if total_weight <= 0:
            raise IntegrityError("encrypted shard sums to a non-positive weight")
        half = 2 ** (FIELD_BITS - 1)
        low = ((ints[:-1] + half) % 2**FIELD_BITS) - half
        high = (ints[:-1] - low) >> FIELD_BITS
        values = np.stack([low, high], axis=1).reshape(-1)[:count].astype(np.float64)
        mean: np.ndarray = values * (self.step / total_weight)
        return mean


def slots_for(count: int) -> int:
    """Slots a shard of ``count`` values takes (the weight slot included)."""
    return math.ceil(count / VALUES_PER_SLOT) + 1


def ciphertexts_for(count: int) -> int:
    """Ciphertexts a shard of ``count`` values takes."""
    return math.ceil(slots_for(count) / SLOTS)


def encrypted_nbytes(counts: Sequence[int], context: Any | None = None) -> int:
    """Exact bytes on the wire of encrypted shards of ``counts`` values each.

    Every full ciphertext serialises to the same size and so does a partial one of the
    same slot count; the sizes are measured once (with ``context``, else a throwaway
    secret context of this scheme) and cached.
    """
    total = 0
    for count in counts:
        slots = slots_for(count)
        full, rest = divmod(slots, SLOTS)
        total += full * _ciphertext_nbytes(SLOTS, context) + (_ciphertext_nbytes(rest, context) if rest else 0)
    return total


_SIZES: dict[int, int] = {}


def _ciphertext_nbytes(slots: int, context: Any | None) -> int:
    """Length-prefixed bytes of one ciphertext of ``slots`` slots (they depend only on
    the slot count's varint in TenSEAL's framing, not on the values)."""
    size = _SIZES.get(slots)
    if size is None:
        if context is None or not context.has_secret_key():
            context = _context()
        size = _SIZES[slots] = len(_encrypt_slots(context, np.zeros(slots)))
    return size


_PARALLEL_VALUES = 1 << 20  # below this, handing work to other processes costs more than it saves
_WORKER_CONTEXT: Any = None
_POOLS: dict[tuple[int, int], Any] = {}


def _encrypt_slots(context: Any, slots: np.ndarray) -> bytes:
    """One length-prefixed ciphertext of ≤ SLOTS slots."""
    return framed(tenseal().ckks_vector(context, slots).serialize())


def _pool(context: Any, workers: int) -> Any:
    """A process pool whose workers hold ``context`` (started once per context and size)."""
    key = (id(context), workers)
    pool = _POOLS.get(key)
    if pool is None:
        import atexit
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        secret = context.serialize(save_secret_key=True, save_galois_keys=False, save_relin_keys=False)
        pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),  # never fork a process with gRPC/torch threads
            initializer=_init_worker,
            initargs=(secret,),
        )
        atexit.register(pool.shutdown, cancel_futures=True)
        _POOLS[key] = pool
    return pool


def _init_worker(secret: bytes) -> None:
    global _WORKER_CONTEXT
    _WORKER_CONTEXT = tenseal().context_from(secret)


def _encrypt_in_worker(slots: np.ndarray) -> bytes:
    return _encrypt_slots(_WORKER_CONTEXT, slots)
