"""The cold-tier decoder's float32 product is bit-identical to the exact product rounded once to float32."""

from __future__ import annotations

import numpy as np
import pytest

from fedshard.errors import StoreError
from fedshard.store.quantize import BLOCK, ColdFormat, _blocks, _fp8_values, decode, decode_into, encode


def reference_decode(payload: bytes, fmt: ColdFormat, count: int) -> np.ndarray:
    """The float64 decoder (exact product, clipped, one rounding to float32)."""
    blocks = _blocks(count)
    scales = np.frombuffer(payload, dtype=np.float32, count=blocks).astype(np.float64)[:, None]
    raw = np.frombuffer(payload, dtype=np.uint8, offset=4 * blocks)
    if fmt is ColdFormat.FP8:
        q = _fp8_values()[raw]
    elif fmt is ColdFormat.INT4:
        q = np.empty(raw.size * 2, dtype=np.float64)
        q[0::2] = (raw & 0x0F).astype(np.int16) - 8
        q[1::2] = (raw >> 4).astype(np.int16) - 8
    else:
        q = raw.view(np.int8).astype(np.float64)
    limit = float(np.finfo(np.float32).max)
    return np.clip(q.reshape(blocks, BLOCK) * scales, -limit, limit).astype(np.float32).reshape(-1)[:count]


def samples() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    big = np.finfo(np.float32).max
    return [
        rng.standard_normal(10_000).astype(np.float32),
        (rng.standard_normal(4_000) * 1e-38).astype(np.float32),  # subnormal products
        np.concatenate([rng.uniform(-big, big, 640), [big, -big, 0.0, -0.0]]).astype(np.float32),
        (rng.standard_normal(777) * np.exp(rng.uniform(-80, 80, 777))).astype(np.float32),
    ]


@pytest.mark.parametrize("fmt", list(ColdFormat))
def test_decode_matches_the_float64_reference_bit_for_bit(fmt: ColdFormat) -> None:
    for values in samples():
        payload = encode(values, fmt)
        got = decode(payload, fmt, values.size)
        want = reference_decode(payload, fmt, values.size)
        assert got.dtype == np.float32 and np.isfinite(got).all()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", list(ColdFormat))
@pytest.mark.parametrize("shape", [(256, 256), (100, 64), (7, 100), (256, 192), (64,), (3,), (0, 64)])
def test_decode_into_a_tile_of_a_larger_tensor_gives_decodes_bits(fmt: ColdFormat, shape: tuple[int, ...]) -> None:
    """Dequantised in place into a strided tile: the same bits as :func:`decode`, and nothing
    outside the tile written."""
    rng = np.random.default_rng(3)
    values = (rng.normal(size=shape) * rng.choice([1e-3, 1.0, 1e3], size=shape)).astype(np.float32)
    payload = encode(values, fmt)
    expected = decode(payload, fmt, values.size).reshape(shape)
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    larger = np.full((rows + 4, cols + BLOCK), np.float32(7.0))
    tile = larger[2 : 2 + rows, 3 : 3 + cols].reshape(shape)
    decode_into(payload, fmt, tile)
    assert np.array_equal(tile.view(np.uint32), expected.view(np.uint32))
    outside = np.ones(larger.shape, dtype=bool)
    outside[2 : 2 + rows, 3 : 3 + cols] = False
    assert (larger[outside] == 7.0).all()


def test_decode_into_refuses_a_short_payload_and_a_non_float32_destination() -> None:
    payload = encode(np.ones((4, 64), np.float32), ColdFormat.INT8)
    with pytest.raises(StoreError, match="cannot hold"):
        decode_into(payload[:-1], ColdFormat.INT8, np.empty((4, 64), np.float32))
    with pytest.raises(StoreError, match="float32 destination"):
        decode_into(payload, ColdFormat.INT8, np.empty((4, 64), np.float64))
