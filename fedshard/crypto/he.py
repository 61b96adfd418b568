"""Homomorphic encryption of gradient shards, sized for sums only (TenSEAL; the scheme, BFV by
default or CKKS, is ``he.scheme``: :mod:`fedshard.crypto.he_schemes`).

* **Packing**: a site multiplies its update by ``weight / weight_scale`` (≤ 1), clips
  it to ``[-value_range, value_range]`` and quantises it with step
  ``value_range / (2^(F - 1 - headroom) - 1)``, where ``F`` is the scheme's field width
  (BFV 21 bits, CKKS 19) and ``headroom = ceil(log2(max_sites))`` keeps the sum of up to
  ``max_sites`` sites inside the field. Two such integers travel in one slot as
  ``a + b·2^F``; the last slot of every *pack* carries the weight itself, in fixed point
  (30 bits). Both schemes add slots exactly (BFV modulo its 42-bit prime, CKKS up to a noise
  far below the 0.5 that rounding to the nearest integer tolerates), so the decrypted *sums*
  are exact integers; the only error is quantisation: at most ``step / 2`` per value and site.
* **Packs** (:func:`pack_layout`): the small shards a site sends to one zone and
  aggregate group share one run of ciphertexts and one weight slot, laid out from the
  plan and the routing only (never the scheme or the values), so every site packs alike
  and zones add packs slot-wise; a shard that fills whole ciphertexts no longer spills its
  weight into another one.
* **Encryption** is symmetric (with the secret key, which every site holds): twice as
  fast as public-key encryption, and the ciphertexts add the same way.
* **Cost**: one ~65.7 kB ciphertext per 8192 values under BFV (2.0× the bytes of float32),
  per 4096 under CKKS (4.0×); :func:`encrypted_nbytes` gives the exact bytes of any shard
  or pack sizes.

Threat model: every site holds the same secret context; zones get a public context
that has no secret key (and no Galois or relinearisation keys), so a zone, or anyone
who breaches it, learns nothing from what it aggregates. A site that colludes with a
zone can decrypt another site's individual update; differential privacy still bounds
what that reveals. Each party loads its context against its own config's ``he.scheme``
(:func:`load_context`): a context of another scheme is refused in one line.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.crypto.ciphertexts import framed, split
from fedshard.crypto.he_schemes import SCHEMES, HeScheme, scheme_of, tenseal
from fedshard.crypto.key_files import CERT_MODE, KEY_MODE, write_files
from fedshard.errors import ConfigError, IntegrityError

if TYPE_CHECKING:
    import tenseal as ts

__all__ = [
    "PACK_SLOTS",
    "PUBLIC_CONTEXT_FILE",
    "SECRET_CONTEXT_FILE",
    "DEFAULT_SCHEME",
    "ENCRYPTED_DTYPE",
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
ENCRYPTED_DTYPE = "he"
"""The ``dtype`` label of encrypted shards on the wire and in manifests."""
DEFAULT_SCHEME = "bfv"
"""``he.scheme`` when a config names none: half CKKS's bytes, exact sums (see :mod:`fedshard.crypto.he_schemes`)."""

VALUES_PER_SLOT = 2
WEIGHT_BITS = 30  # fixed-point bits of the weight slot
PACK_SLOTS = 256 * 2048
"""A pack grows to at most this many slots (2^20 values: 128 BFV or 256 CKKS ciphertexts) unless one shard
needs more; a count of slots, not of ciphertexts, so the layout does not depend on the scheme."""


def _scheme(name: str) -> HeScheme:
    return SCHEMES.get_part(name)


def he_init(out: str | os.PathLike[str], *, scheme: str = DEFAULT_SCHEME, force: bool = False) -> tuple[Path, Path]:
    """Create the federation's contexts of ``scheme`` (``he.scheme``): ``secret.ctx`` (sites,
    ``0600``) and ``public.ctx`` (zones: no secret key, no Galois or relinearisation keys)."""
    ctx = _scheme(scheme).context()
    secret = ctx.serialize(save_secret_key=True, save_galois_keys=False, save_relin_keys=False)
    public = ctx.serialize(save_secret_key=False, save_galois_keys=False, save_relin_keys=False)
    out = Path(out)
    paths = (out / SECRET_CONTEXT_FILE, out / PUBLIC_CONTEXT_FILE)
    write_files([(paths[0], secret, KEY_MODE), (paths[1], public, CERT_MODE)], force)
    return paths


def load_context(path: str | os.PathLike[str], *, secret: bool, scheme: str = DEFAULT_SCHEME) -> ts.Context:
    """Load a context of ``scheme`` (the party's own ``he.scheme``); ``secret=True`` requires
    the secret key, ``False`` refuses it.

    Raises
    ------
    ConfigError
        The file is missing, not a context, or one of another scheme or other parameters; a
        site is given the public context, or a zone the secret one (it must never hold the key).
    """
    wanted = _scheme(scheme)
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read HE context {path}: {exc.strerror or exc}") from None
    try:
        ctx = tenseal().context_from(data)
    except Exception:  # TenSEAL raises plain exceptions for malformed input
        raise ConfigError(f"{path} is not an HE context (make one with `fedshard keys he-init`)") from None
    if not wanted.is_ours(ctx):
        found = scheme_of(ctx)
        what = f"a {found.name} context" if found is not None else "not a context of fedshard's schemes"
        raise ConfigError(
            f"{path} is {what}, and he.scheme is {scheme} (make one with `fedshard keys he-init --scheme {scheme}`)"
        )
    if secret and not ctx.has_secret_key():
        raise ConfigError(f"{path} has no secret key: sites need {SECRET_CONTEXT_FILE}")
    if not secret and ctx.has_secret_key():
        raise ConfigError(f"{path} holds the secret key: zones must be given {PUBLIC_CONTEXT_FILE}, never the secret")
    return ctx


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

    def ciphertexts(self, scheme: str) -> int:
        """Ciphertexts the pack takes under ``scheme``."""
        return ciphertexts_for(self.count, scheme)


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

    @functools.cached_property
    def scheme(self) -> HeScheme:
        """The scheme of :attr:`context` (:class:`ConfigError` if it is none of fedshard's)."""
        found = scheme_of(self.context)
        if found is None:
            raise ConfigError("the HE context is not one of fedshard's schemes (make one with `fedshard keys he-init`)")
        return found

    @property
    def levels(self) -> int:
        """Largest quantised magnitude of one site's value."""
        return int(2 ** (self.scheme.field_bits - _headroom(self.max_sites) - 1) - 1)

    @property
    def step(self) -> float:
        """Quantisation step: the error bound per value and site is half of it."""
        return self.value_range / self.levels

    def slots_for(self, count: int) -> int:
        """Slots a shard of ``count`` values takes (the weight slot included)."""
        return slots_for(count)

    def encode(self, values: np.ndarray, weight: float) -> tuple[np.ndarray, int]:
        """Slots (int64) for ``weight · values``, and how many values were clipped.

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
        slots = pairs[:, 0] + pairs[:, 1] * (1 << self.scheme.field_bits)
        weight_slot = round(weight * 2**WEIGHT_BITS)
        return np.append(slots, np.int64(weight_slot)), clipped

    def encrypt(self, values: np.ndarray, weight: float) -> tuple[bytes, int]:
        """Ciphertext bytes of ``weight · values`` (length-prefixed ciphertexts), and the clip count."""
        slots, clipped = self.encode(values, weight)
        scheme, per = self.scheme, self.scheme.slots
        return b"".join(
            framed(scheme.encrypt(self.context, slots[i : i + per])) for i in range(0, slots.size, per)
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
        scheme, per = self.scheme, self.scheme.slots
        encoded = {sid: self.encode(v, weight) for sid, v in shards.items()}
        clipped = sum(n for _, n in encoded.values())
        pieces = [(sid, slots[i : i + per]) for sid, (slots, _) in encoded.items() for i in range(0, slots.size, per)]
        if workers < 2 or len(pieces) * per * VALUES_PER_SLOT < _PARALLEL_VALUES:
            blobs = [framed(scheme.encrypt(self.context, piece)) for _, piece in pieces]
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
        scheme = self.scheme
        slots = np.concatenate([scheme.decrypt(self.context, b) for b in split(data)])
        needed = self.slots_for(count)
        if slots.size < needed:
            raise IntegrityError(f"encrypted shard holds {slots.size} slots, {needed} expected")
        ints = slots[:needed]
        total_weight = float(ints[-1]) / 2**WEIGHT_BITS
        if total_weight <= 0:
            raise IntegrityError("encrypted shard sums to a non-positive weight")
        bits = scheme.field_bits
        half = 2 ** (bits - 1)
        low = ((ints[:-1] + half) % 2**bits) - half
        high = (ints[:-1] - low) >> bits
        values = np.stack([low, high], axis=1).reshape(-1)[:count].astype(np.float64)
        mean: np.ndarray = values * (self.step / total_weight)
        return mean


def slots_for(count: int) -> int:
    """Slots a shard of ``count`` values takes (the weight slot included)."""
    return math.ceil(count / VALUES_PER_SLOT) + 1


def ciphertexts_for(count: int, scheme: str = DEFAULT_SCHEME) -> int:
    """Ciphertexts a shard of ``count`` values takes under ``scheme``."""
    return math.ceil(slots_for(count) / _scheme(scheme).slots)


def encrypted_nbytes(counts: Sequence[int], scheme: str = DEFAULT_SCHEME) -> int:
    """Exact bytes on the wire of encrypted shards of ``counts`` values each under ``scheme``.

    Every full ciphertext serialises to the same size and so does a partial one of the
    same slot count; the sizes are measured once (with a throwaway secret context of the
    scheme) and cached.
    """
    per = _scheme(scheme).slots
    total = 0
    for count in counts:
        slots = slots_for(count)
        full, rest = divmod(slots, per)
        total += full * _ciphertext_nbytes(scheme, per) + (_ciphertext_nbytes(scheme, rest) if rest else 0)
    return total


_SIZES: dict[tuple[str, int], int] = {}
_SIZING_CONTEXTS: dict[str, Any] = {}


def _ciphertext_nbytes(scheme: str, slots: int) -> int:
    """Length-prefixed bytes of one ciphertext of ``slots`` slots (they depend only on
    the slot count's varint in TenSEAL's framing, not on the values)."""
    size = _SIZES.get((scheme, slots))
    if size is None:
        parts = _scheme(scheme)
        context = _SIZING_CONTEXTS.get(scheme)
        if context is None:
            context = _SIZING_CONTEXTS[scheme] = parts.context()
        size = _SIZES[(scheme, slots)] = len(framed(parts.encrypt(context, np.zeros(slots, dtype=np.int64))))
    return size


_PARALLEL_VALUES = 1 << 20  # below this, handing work to other processes costs more than it saves
_WORKER_CONTEXT: Any = None
_WORKER_SCHEME: HeScheme | None = None
_POOLS: dict[tuple[int, int], Any] = {}


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
    global _WORKER_CONTEXT, _WORKER_SCHEME
    _WORKER_CONTEXT = tenseal().context_from(secret)
    _WORKER_SCHEME = scheme_of(_WORKER_CONTEXT)


def _encrypt_in_worker(slots: np.ndarray) -> bytes:
    assert _WORKER_SCHEME is not None  # the codec's context, whose scheme it checked
    return framed(_WORKER_SCHEME.encrypt(_WORKER_CONTEXT, slots))
