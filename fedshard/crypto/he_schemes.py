"""The homomorphic schemes shards can travel under (``he.scheme``), both TenSEAL's, behind
:class:`HeScheme` and named in :data:`SCHEMES`.

Zones only ever *add* ciphertexts, so either scheme needs multiplicative depth 0 and one
small ring: degree N = 4096, coefficient modulus [60, 49] bits (109 bits, the 128-bit
security bound of the HE standard for N = 4096; the 49-bit prime only serves key
switching, which sums never need). Encryption is symmetric (with the secret key every site
holds): twice as fast as public-key encryption, and the ciphertexts add the same way. A
ciphertext serialises to ~65.7 kB either way; what differs is how many integers it carries
and how exactly they add:

* **bfv** (the default): 4096 slots of integers modulo the prime ``t = 2^42 − 25``
  (``t ≡ 1 mod 2N``, so the ring batches), added exactly modulo ``t``: two 21-bit signed
  fields per slot, **8192 values per ciphertext, 2.0× the bytes of float32**. Sums of 256
  fresh ciphertexts decrypt exactly (tested); the noise budget of the 60-bit data prime
  over the 42-bit plaintext leaves room for many more.
* **ckks**: 2048 slots of reals (TenSEAL uses the real half of CKKS's complex slots) at
  scale 2^20, added up to a small noise (≈ 0.03 for 64 ciphertexts) that rounding to the
  nearest integer removes: two 19-bit fields per slot, 4096 values per ciphertext, 4.0×.

Each scheme packs two signed integer fields into a slot (``a + b·2^F``); the codec
(:class:`~fedshard.crypto.he.HeCodec`) quantises values into those fields with headroom for
``max_sites`` contributions, so the decrypted sums are exact integers under both schemes and
the only error is quantisation (BFV's wider field quarters it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from fedshard.registry import Registry

if TYPE_CHECKING:
    import tenseal as ts

__all__ = ["SCHEMES", "Bfv", "Ckks", "HeScheme", "scheme_of", "tenseal"]

POLY_DEGREE = 4096
COEFF_BITS = (60, 49)


def tenseal() -> Any:
    """The TenSEAL module (imported on first use: only sites and zones of encrypted federations need it)."""
    import tenseal

    return tenseal


@runtime_checkable
class HeScheme(Protocol):
    """A homomorphic scheme whose ciphertexts of packed integer slots zones can add."""

    name: str
    """What ``he.scheme`` calls it."""
    slots: int
    """Slots per ciphertext."""
    field_bits: int
    """Bits of each of the two signed integer fields a slot carries."""

    def context(self) -> ts.Context:
        """A fresh secret context of this scheme (symmetric encryption, not yet serialised)."""
        ...

    def is_ours(self, context: Any) -> bool:
        """True if ``context`` has exactly this scheme's parameters."""
        ...

    def encrypt(self, context: Any, slots: np.ndarray) -> bytes:
        """One serialised ciphertext of ≤ :attr:`slots` integer slots (int64)."""
        ...

    def load(self, context: Any, blob: bytes) -> Any:
        """A ciphertext (that zones add with ``+=``) from its serialised bytes."""
        ...

    def decrypt(self, context: Any, blob: bytes) -> np.ndarray:
        """The integer slots (int64) of one serialised ciphertext (secret context)."""
        ...


def _ring_matches(context: Any, scheme_type: Any) -> bool:
    data = context.seal_context().data
    parms = data.key_context_data().parms()
    return bool(
        parms.scheme() == scheme_type.value
        and parms.poly_modulus_degree() == POLY_DEGREE
        and data.key_context_data().total_coeff_modulus_bit_count() == sum(COEFF_BITS)
        and data.first_context_data().total_coeff_modulus_bit_count() == COEFF_BITS[0]
    )


class Bfv:
    """TenSEAL's BFV: exact integer slots modulo :attr:`PLAIN_MODULUS` (see the module docstring)."""

    name = "bfv"
    slots = POLY_DEGREE
    field_bits = 21
    PLAIN_MODULUS = 4398046486529
    """The prime 2^42 − 25 (≡ 1 mod 8192): two 21-bit signed fields fit within ±t/2."""

    def context(self) -> ts.Context:
        ts = tenseal()
        return ts.context(
            ts.SCHEME_TYPE.BFV,
            POLY_DEGREE,
            plain_modulus=self.PLAIN_MODULUS,
            coeff_mod_bit_sizes=list(COEFF_BITS),
            encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC,
        )

    def is_ours(self, context: Any) -> bool:
        """The ring, and with the secret key the plain modulus too (TenSEAL does not expose it:
        2^41 lies above t/2, so it decrypts to 2^41 − t). A public context's ``t`` is in its
        parameters' id, which every ciphertext carries: a zone refuses ciphertexts of another."""
        try:
            if not _ring_matches(context, tenseal().SCHEME_TYPE.BFV):
                return False
            if not context.has_secret_key():
                return True
            probe = 1 << 41
            back = tenseal().bfv_vector(context, [probe]).decrypt()[0]
            return bool(probe - back == self.PLAIN_MODULUS)
        except Exception:  # TenSEAL's bindings raise plain exceptions
            return False

    def encrypt(self, context: Any, slots: np.ndarray) -> bytes:
        return bytes(tenseal().bfv_vector(context, np.asarray(slots, dtype=np.int64).tolist()).serialize())

    def load(self, context: Any, blob: bytes) -> Any:
        return tenseal().bfv_vector_from(context, blob)

    def decrypt(self, context: Any, blob: bytes) -> np.ndarray:
        # TenSEAL decrypts to the centred representatives in (−t/2, t/2]: signed sums as they are
        return np.asarray(self.load(context, blob).decrypt(), dtype=np.int64)


class Ckks:
    """TenSEAL's CKKS at scale 2^20: real slots that sums keep within rounding of integers."""

    name = "ckks"
    slots = POLY_DEGREE // 2
    field_bits = 19
    SCALE_BITS = 20

    def context(self) -> ts.Context:
        ts = tenseal()
        ctx = ts.context(
            ts.SCHEME_TYPE.CKKS,
            POLY_DEGREE,
            coeff_mod_bit_sizes=list(COEFF_BITS),
            encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC,
        )
        ctx.global_scale = 2**self.SCALE_BITS
        return ctx

    def is_ours(self, context: Any) -> bool:
        try:
            return _ring_matches(context, tenseal().SCHEME_TYPE.CKKS) and context.global_scale == 2**self.SCALE_BITS
        except Exception:  # TenSEAL's bindings raise plain exceptions (a BFV context has no scale)
            return False

    def encrypt(self, context: Any, slots: np.ndarray) -> bytes:
        return bytes(tenseal().ckks_vector(context, np.asarray(slots, dtype=np.float64)).serialize())

    def load(self, context: Any, blob: bytes) -> Any:
        return tenseal().ckks_vector_from(context, blob)

    def decrypt(self, context: Any, blob: bytes) -> np.ndarray:
        slots: np.ndarray = np.rint(np.asarray(self.load(context, blob).decrypt(), dtype=np.float64))
        return slots.astype(np.int64)


SCHEMES: Registry[HeScheme] = Registry("homomorphic scheme", "he.scheme", (Bfv(), Ckks()))
"""The schemes by name (``he.scheme``)."""


def scheme_of(context: Any) -> HeScheme | None:
    """The registered scheme whose parameters ``context`` has, or None."""
    return next((s for s in SCHEMES.values() if s.is_ours(context)), None)
