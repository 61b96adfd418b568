"""Low-precision formats of the cold tier: fp8 (E4M3), int8 and int4 with per-block scales.

A shard's values are flattened (C order) and cut into blocks of :data:`BLOCK` = 64
consecutive values (the last block zero-padded); each block has its own float32 scale
``s = max|x| / q_max`` over the block, so one outlier only coarsens its own 64 values.
The encoded payload is ``scales (float32 × blocks) ‖ codes``.

========  ======================================  ==========  ==============================================
format    code of a value ``x``                   bytes/value error bound per value (``s`` its block's scale)
========  ======================================  ==========  ==============================================
``int8``  ``round(x/s)`` in [-127, 127]           1 + 1/16    ``s/2`` = max|block| / 254
``int4``  ``round(x/s)`` in [-7, 7], 2 per byte   1/2 + 1/16  ``s/2`` = max|block| / 14
``fp8``   ``x/s`` as float8 E4M3 (torch's), ≤448  1 + 1/16    ``2⁻⁴·|x| + 2⁻¹⁰·s``: 6.25 % relative, with an
                                                              absolute floor of max|block|/458,752 for values
                                                              under 2⁻⁶ of the block's scale (E4M3 subnormals)
========  ======================================  ==========  ==============================================

On top of each bound comes float32 rounding of the decoded value (``2⁻²³·|x|``, which
:func:`error_bound` includes). Rounding is to nearest (ties to even). fp8 keeps a
relative precision over the whole range of a block; int8 keeps an absolute one, which
is finer for values near the block's maximum and coarser for tiny ones. int8 is the
default of ``fedshard store tier``: for weights (roughly Gaussian blocks) its typical
error is about 4× below fp8's at the same size (measured: RMS 0.006 vs 0.025 on N(0, 1)).

Only finite floating-point values are encoded (the store keeps other shards hot).
"""

from __future__ import annotations

import functools
import math
from enum import StrEnum

import numpy as np

from fedshard.errors import StoreError

__all__ = [
    "BLOCK",
    "ColdFormat",
    "decode",
    "decode_into",
    "encodable",
    "encode",
    "encoded_nbytes",
    "error_bound",
    "fp8_codes",
    "BOUND_TEXT",
    "largest_code",
]

BLOCK = 64


class ColdFormat(StrEnum):
    """A cold-tier encoding (see the module docstring for each one's error bound)."""

    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"


_QMAX = {ColdFormat.INT8: 127.0, ColdFormat.INT4: 7.0, ColdFormat.FP8: 448.0}


def largest_code(fmt: ColdFormat) -> float:
    """The largest magnitude a code of ``fmt`` stands for (a value is at most its block's scale times it)."""
    return _QMAX[fmt]


BOUND_TEXT = {
    ColdFormat.INT8: "s/2 = max|block|/254",
    ColdFormat.INT4: "s/2 = max|block|/14",
    ColdFormat.FP8: "2^-4·|x| + 2^-10·s (s = max|block|/448)",
}


@functools.cache
def _fp8_values() -> np.ndarray:
    """The value (float64) of each of the 256 E4M3 codes, as torch decodes them (a lookup table: no torch per read)."""
    import torch

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    return codes.to(torch.float32).numpy().astype(np.float64)


@functools.cache
def _fp8_values32() -> np.ndarray:
    """:func:`_fp8_values` as float32 (every E4M3 value is exact in float32)."""
    return _fp8_values().astype(np.float32)


def fp8_codes(values: np.ndarray) -> np.ndarray:
    """E4M3 codes (uint8) of float32 ``values`` within ±448, rounded to nearest, ties to even.

    The same codes as torch's ``tensor.to(torch.float8_e4m3fn)`` (a test checks it), found
    by searching torch's own table of E4M3 values: NumPy only, so no torch thread pool
    per shard.
    """
    table = _fp8_values()[:127]  # codes 0..126: the non-negative finite values, ascending
    magnitude = np.abs(values.astype(np.float64))
    hi = np.minimum(np.searchsorted(table, magnitude, side="left"), 126)
    lo = np.maximum(hi - 1, 0)
    above, below = table[hi] - magnitude, magnitude - table[lo]
    # a code's lowest bit is its mantissa's: an even code is the "even" neighbour of a tie
    code = np.where((above < below) | ((above == below) & (hi % 2 == 0)), hi, lo).astype(np.uint8)
    signed: np.ndarray = code | (np.signbit(values).astype(np.uint8) << 7)
    return signed


def _blocks(count: int) -> int:
    return max(1, math.ceil(count / BLOCK))


def _code_bytes(count: int, fmt: ColdFormat) -> int:
    padded = _blocks(count) * BLOCK
    return padded // 2 if fmt is ColdFormat.INT4 else padded


def encoded_nbytes(count: int, fmt: ColdFormat) -> int:
    """Bytes of the payload that encodes ``count`` values in ``fmt``."""
    return 4 * _blocks(count) + _code_bytes(count, fmt)


def _scales(values: np.ndarray, fmt: ColdFormat) -> tuple[np.ndarray, np.ndarray]:
    """Padded ``(blocks, BLOCK)`` float64 values and their float32 scales (``s·q_max ≥ max|block|``)."""
    count = values.size
    padded = np.zeros(_blocks(count) * BLOCK, dtype=np.float64)
    padded[:count] = values.reshape(-1)
    blocks = padded.reshape(-1, BLOCK)
    qmax = _QMAX[fmt]
    absmax = np.abs(blocks).max(axis=1)
    scales = (absmax / qmax).astype(np.float32)
    # float32 rounding may land the scale just below absmax/qmax; nudge it up so no code overflows
    low = scales.astype(np.float64) * qmax < absmax
    scales[low] = np.nextafter(scales[low], np.float32(np.inf))
    return blocks, scales


def encodable(values: np.ndarray) -> bool:
    """True if ``values`` can go to the cold tier: floating point, finite, within float32's range."""
    if values.dtype not in (np.float32, np.float64):
        return False
    if values.size == 0:
        return True
    with np.errstate(over="ignore"):
        return bool(np.isfinite(values.astype(np.float32)).all())


def encode(values: np.ndarray, fmt: ColdFormat) -> bytes:
    """Encode finite floating-point ``values`` (any shape; flattened in C order) in ``fmt``."""
    if not np.issubdtype(values.dtype, np.floating):
        raise StoreError(f"only floating-point shards have a cold format, got {values.dtype}")
    blocks, scales = _scales(values, fmt)
    safe = np.where(scales > 0, scales, np.float32(1)).astype(np.float64)[:, None]
    scaled = blocks / safe
    if fmt is ColdFormat.FP8:
        codes = fp8_codes(np.clip(scaled, -448.0, 448.0).astype(np.float32).reshape(-1)).tobytes()
    else:
        q = np.clip(np.rint(scaled), -_QMAX[fmt], _QMAX[fmt]).astype(np.int8).reshape(-1)
        if fmt is ColdFormat.INT4:
            nib = (q + 8).astype(np.uint8)  # 1..15
            codes = (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()
        else:
            codes = q.tobytes()
    return scales.tobytes() + codes


def decode(payload: bytes | memoryview | np.ndarray, fmt: ColdFormat, count: int) -> np.ndarray:
    """Decode ``count`` values (float32, flat) from a payload written by :func:`encode`."""
    blocks = _blocks(count)
    if len(payload) != encoded_nbytes(count, fmt):
        raise StoreError(f"{fmt.value} payload of {len(payload)} bytes cannot hold {count} values")
    scales = np.frombuffer(payload, dtype=np.float32, count=blocks)[:, None]
    raw = np.frombuffer(payload, dtype=np.uint8, offset=4 * blocks)
    if fmt is ColdFormat.FP8:
        q = _fp8_values32()[raw]
    elif fmt is ColdFormat.INT4:
        q = np.empty(raw.size * 2, dtype=np.float32)
        q[0::2] = (raw & 0x0F).astype(np.int8) - 8
        q[1::2] = (raw >> 4).astype(np.int8) - 8
    else:
        q = raw.view(np.int8).astype(np.float32)
    # One float32 multiplication: a code has at most 8 significant bits and a scale 24, so the
    # exact product fits float64 and IEEE rounds the float32 product once, to the same value as
    # the exact product rounded to float32 (what a float64 product cast to float32 gives; a
    # test checks it). Products past float32's largest value (a nudged scale next to it) become
    # inf and are clipped back to it, as the float64 product would have been.
    with np.errstate(over="ignore"):
        out = (q.reshape(blocks, BLOCK) * scales).reshape(-1)
    limit = np.float32(np.finfo(np.float32).max)
    if blocks and float(np.abs(scales).max()) * _QMAX[fmt] > float(limit):
        np.clip(out, -limit, limit, out=out)
    return out[:count]


def error_bound(values: np.ndarray, fmt: ColdFormat) -> np.ndarray:
    """Largest ``|decode(encode(x)) - x|`` each value may have (float64, flat; see the module docstring)."""
    blocks, scales = _scales(values, fmt)
    s = np.repeat(scales.astype(np.float64), BLOCK)[: values.size]
    x = np.abs(blocks.reshape(-1)[: values.size])
    tiny = 2.0**-149  # float32 rounding of a subnormal result
    bound: np.ndarray
    if fmt is ColdFormat.FP8:
        # E4M3 half-ulp (2^-4 relative, 2^-10 absolute below 2^-6) on x/s, float32 rounding of x/s and of the result
        bound = 2.0**-4 * x * (1 + 2.0**-20) + 2.0**-10 * s * (1 + 2.0**-20) + 2.0**-21 * x + tiny
    else:  # half a step, float64 division error, float32 rounding of the result
        bound = 0.5 * s * (1 + 2.0**-23) + 2.0**-23 * x + tiny
    return bound


def decode_into(payload: bytes | memoryview | np.ndarray, fmt: ColdFormat, out: np.ndarray) -> None:
    """Decode a payload of :func:`encode` into ``out`` (float32, the shard's shape, a strided view
    allowed: a tile of a larger tensor), in place: :func:`decode`'s values, copied in."""
    if out.dtype != np.float32:
        raise StoreError(f"decode_into needs a float32 destination, got {out.dtype}")
    out[...] = decode(payload, fmt, out.size).reshape(out.shape)
