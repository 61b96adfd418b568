"""DP-SGD's Gaussian noise from a cryptographically secure source.

Opacus draws its noise from a ``torch.Generator`` (a Mersenne Twister). Its state can be
recovered from enough outputs, and an attacker who can predict the noise can subtract it.
Opacus's own ``secure_mode`` needs ``torchcsprng``, which has no wheels for current torch.
fedshard therefore draws the noise itself, by default:

* **source:** a ChaCha20 keystream (``cryptography``), keyed with 32 bytes from the
  operating system (``os.urandom``), a fresh key per round. Nobody, the coordinator
  included, can predict it or replay it. The stream's 32-bit block counter starts at 0 (a
  random 12-byte nonce beside it) and the source takes a fresh key before the counter would
  overflow (2³⁸ bytes): a random counter start once made about one long DP run in 40 fail
  mid-training (``cryptography`` refuses to wrap the counter).
* **uniforms:** 53-bit uniforms in (0, 1], turned into normals by the Box-Muller transform
  in float64.
* **sampling:** the sum of four normals, halved. This is the defence of Holohan & Braun
  (2021, section 5.1) against the floating-point attacks on Gaussian samplers
  (Jin et al., 2021), and the one Opacus's ``secure_mode`` uses. The attacks read the seed
  back from the gaps in a float sample. The sum has the same variance, and its float gaps
  no longer reveal one draw.

:func:`install` puts this sampler into an Opacus ``DPOptimizer`` in place of its
``add_noise``. It relies on Opacus 1.6 internals (the pinned version), which it checks
first. An optimiser they do not fit keeps Opacus's own noise, with a warning that says so.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from fedshard.privacy._opacus_internals import processed_flags

__all__ = ["SecureGaussian", "install"]

log = logging.getLogger(__name__)

_TWO_POW_53 = float(1 << 53)
_KEYSTREAM_BYTES = (1 << 32) * 64
"""Bytes one ChaCha20 key and nonce give before its 32-bit block counter would wrap."""
_SUMMED = 4
"""Normals summed per output (Holohan & Braun's n = 2: 2n draws), then divided by √4 = 2."""
_CHUNK = 1 << 18
"""Outputs drawn from one keystream read (a step's noise for a small model, in one call): larger
draws go by chunks of this many, so their float64 working memory stays a few tens of MiB."""


class SecureGaussian:
    """Normal noise from a ChaCha20 keystream keyed by the OS (one instance per round)."""

    keystream_bytes = _KEYSTREAM_BYTES
    """Bytes drawn under one key before a fresh one is taken (a test lowers it)."""

    def __init__(self) -> None:
        self._stream, self._left = self._fresh(), self.keystream_bytes

    @staticmethod
    def _fresh() -> Any:
        """A ChaCha20 keystream under a fresh OS key: the block counter at 0, a random 96-bit nonce."""
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        nonce = bytes(4) + os.urandom(12)  # RFC 7539: a 4-byte little-endian counter, then the nonce
        return Cipher(algorithms.ChaCha20(os.urandom(32), nonce), mode=None).encryptor()

    def _bytes(self, n: int) -> bytes:
        """``n`` keystream bytes, under a fresh key whenever the current one is used up."""
        parts = []
        while n > 0:
            if self._left == 0:
                self._stream, self._left = self._fresh(), self.keystream_bytes
            take = min(n, self._left)
            parts.append(self._stream.update(bytes(take)))
            self._left -= take
            n -= take
        return b"".join(parts)

    def _uniform(self, n: int) -> np.ndarray:
        """``n`` uniforms in (0, 1] with 53 random bits each."""
        raw = np.frombuffer(self._bytes(8 * n), dtype=np.uint64)
        return ((raw >> np.uint64(11)).astype(np.float64) + 1.0) / _TWO_POW_53

    def standard(self, n: int) -> np.ndarray:
        """``n`` standard normals (Box-Muller on pairs of uniforms), float64."""
        pairs = (n + 1) // 2
        u1, u2 = self._uniform(2 * pairs).reshape(2, pairs)
        radius = np.sqrt(-2.0 * np.log(u1))
        angle = 2.0 * np.pi * u2
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]

    def normal(self, std: float, n: int) -> np.ndarray:
        """``n`` draws of N(0, std²), each the halved sum of four standard normals (see the module docstring)."""
        if std == 0:
            return np.zeros(n)
        out = np.empty(n)
        for start in range(0, n, _CHUNK):  # one keystream read a chunk; memory bounded by the chunk
            m = min(_CHUNK, n - start)
            out[start : start + m] = self.standard(_SUMMED * m).reshape(_SUMMED, m).sum(axis=0)
        out *= std / np.sqrt(_SUMMED)
        return out


def install(optimizer: Any) -> bool:
    """Make an Opacus ``DPOptimizer`` add :class:`SecureGaussian` noise. Returns False, and
    logs why, if its internals are not the ones this relies on (then Opacus's own noise stays)."""
    flags = processed_flags(optimizer, ("params", "noise_multiplier", "max_grad_norm", "add_noise"))
    if flags is None:
        log.warning(
            "DP-SGD noise: %s is not the Opacus 1.6 DPOptimizer fedshard knows; its noise comes from torch's "
            "generator (seeded by the OS), not a cryptographically secure one",
            type(optimizer).__name__,
        )
        return False
    check, mark = flags
    import torch

    source = SecureGaussian()

    def add_noise() -> None:
        std = optimizer.noise_multiplier * optimizer.max_grad_norm
        params = list(optimizer.params)
        for p in params:
            check(p.summed_grad)
        total = sum(p.summed_grad.numel() for p in params)
        draws = source.normal(std, total) if total <= _CHUNK else None  # small models: one draw a step
        start = 0
        for p in params:
            reference = p.summed_grad
            size = reference.numel()
            part = draws[start : start + size] if draws is not None else source.normal(std, size)
            start += size
            noise = torch.from_numpy(part.reshape(tuple(reference.shape))).to(
                dtype=reference.dtype, device=reference.device
            )
            p.grad = (reference + noise).view_as(p)
            mark(p.summed_grad)

    optimizer.add_noise = add_noise
    optimizer.fedshard_secure_noise = True
    return True
