"""Encrypted shards on the wire and at the zone: length-prefixed ciphertexts
(:func:`framed`, :func:`split`), parsed under the federation's context, whatever its scheme
(:func:`load_ciphertexts`), and summed under its public context (:class:`EncryptedSum`).
The schemes are :mod:`fedshard.crypto.he_schemes`; packing and the codec :mod:`fedshard.crypto.he`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedshard.crypto.he_schemes import HeScheme, scheme_of
from fedshard.errors import IntegrityError, PkiError

__all__ = ["EncryptedSum", "context_scheme", "framed", "load_ciphertexts", "split"]

_LEN = 4  # bytes of each ciphertext's length prefix


def context_scheme(context: Any) -> HeScheme:
    """The scheme of ``context``; :class:`PkiError` if it is none of fedshard's (a zone checks
    its context once, then parses every push under that scheme)."""
    scheme = scheme_of(context)
    if scheme is None:
        raise PkiError("the HE context is none of fedshard's schemes (make one with `fedshard keys he-init`)")
    return scheme


def framed(blob: bytes) -> bytes:
    """One serialized ciphertext with its length prefix."""
    return len(blob).to_bytes(_LEN, "little") + blob


def load_ciphertexts(scheme: HeScheme, context: Any, shard_id: str, data: bytes | bytearray | memoryview) -> list[Any]:
    """Parse one encrypted shard under ``context`` of ``scheme`` (:func:`context_scheme`, found
    once per context); :class:`IntegrityError` if it is not ciphertext of this federation's context."""
    try:
        return [scheme.load(context, b) for b in split(data)]
    except IntegrityError:
        raise
    except Exception:
        raise IntegrityError(f"shard {shard_id}: not a ciphertext of this federation's context") from None


def split(data: bytes | bytearray | memoryview) -> list[bytes]:
    """The serialized ciphertexts of an encrypted shard (any contiguous bytes-like)."""
    out, pos = [], 0
    view = memoryview(data).cast("B")
    size = len(view)
    while pos < size:
        if pos + _LEN > size:
            raise IntegrityError("encrypted shard ends inside a length prefix")
        n = int.from_bytes(view[pos : pos + _LEN], "little")
        pos += _LEN
        if n == 0 or pos + n > size:
            raise IntegrityError("encrypted shard has a truncated ciphertext")
        out.append(bytes(view[pos : pos + n]))
        pos += n
    return out


class EncryptedSum:
    """Running sums of encrypted shards under a public context (what a zone keeps).

    Memory is one ciphertext list per shard, whatever the number of sites.
    """

    def __init__(self, context: Any) -> None:
        if context.has_secret_key():
            raise PkiError("zones sum ciphertexts under the public context; refusing one with the secret key")
        self._ctx = context
        self._scheme = context_scheme(context)
        self._sums: dict[str, list[Any]] = {}

    def add(self, shard_id: str, data: bytes | list[Any]) -> None:
        """Fold one encrypted shard (or an encrypted partial sum, or its :meth:`load`-ed
        ciphertexts) into ``shard_id``'s sum."""
        if isinstance(data, bytes | bytearray):
            vectors = load_ciphertexts(self._scheme, self._ctx, shard_id, data)
        else:
            vectors = data
        current = self._sums.get(shard_id)
        if current is None:
            self._sums[shard_id] = vectors
            return
        if len(current) != len(vectors):
            raise IntegrityError(f"shard {shard_id}: {len(vectors)} ciphertexts, earlier pushes had {len(current)}")
        for acc, v in zip(current, vectors, strict=True):
            acc += v

    def __contains__(self, shard_id: object) -> bool:
        return shard_id in self._sums

    def __len__(self) -> int:
        return len(self._sums)

    def shard_ids(self) -> Sequence[str]:
        """Shards summed so far."""
        return list(self._sums)

    def serialize(self, shard_id: str) -> bytes:
        """The encrypted sum of ``shard_id`` (length-prefixed ciphertexts)."""
        return b"".join(framed(v.serialize()) for v in self._sums[shard_id])
