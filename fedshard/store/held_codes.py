"""A streamed weight's cold codes held in memory, dequantised one band of rows at a time.

A :class:`HeldWeight` holds the authenticated int8, fp8 or int4 codes of one ``Linear`` or
``Embedding`` weight of a sealed base (:class:`~fedshard.store._shard_io.ColdCodes`, read
and checked once), grouped into *bands*: runs of whole tile rows of at most
:data:`BAND_VALUES` values (one tile row at least). The computations that need the weight
dequantise it a band at a time into one reused buffer and use the band at once:

* ``x @ Wᵀ + b``: each band gives its rows of the output (:meth:`HeldWeight.linear`);
* the input's gradient ``g @ W``: each band adds its rows' share (:meth:`HeldWeight.input_grad`);
* an embedding lookup: each band that holds a looked-up row gives those rows
  (:meth:`HeldWeight.embed`).

So the full-precision weight never exists: besides the codes (about a quarter of float32
for int8), a band's buffer is all (4 MiB). Dequantising happens in the computing thread,
with torch's own threads (an int8 or fp8 tile whose rows hold whole blocks: one
multiplication by the blocks' scales, the same float32 product as
:func:`~fedshard.store.quantize.decode`, bit for bit; other tiles through NumPy), with no
prefetch thread to compete with torch's for the cores. The bands of one
:class:`BandBuffer` are used one at a time: it is one training thread's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedshard.store._shard_io import ColdCodes
from fedshard.store.quantize import BLOCK, ColdFormat, largest_code

if TYPE_CHECKING:
    import torch

__all__ = ["BAND_VALUES", "BandBuffer", "HeldStats", "HeldWeight"]

BAND_VALUES = 1 << 20
"""Most values a band holds when it spans more than one tile row (4 MiB of float32)."""


@dataclass(slots=True)
class HeldStats:
    """What held weights have dequantised since the counters were made."""

    bands: int = 0
    values: int = 0
    seconds: float = 0.0

    @property
    def fetched_bytes(self) -> int:
        """Float32 bytes dequantised."""
        return 4 * self.values


@dataclass(slots=True)
class BandBuffer:
    """The one float32 buffer the bands of a base are dequantised into, and their counters."""

    values: int
    stats: HeldStats = field(default_factory=HeldStats)
    _array: torch.Tensor | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def band(self, rows: int, cols: int) -> torch.Tensor:
        """A ``(rows, cols)`` float32 view of the buffer (allocated on first use, at :attr:`values`
        or at the size of the band asked for if larger: one tile row of a wide weight)."""
        import torch

        if self._array is None or self._array.numel() < rows * cols:
            self._array = torch.empty(max(self.values, rows * cols), dtype=torch.float32)
        return self._array[: rows * cols].view(rows, cols)

    def release(self) -> None:
        """Free the buffer (the next band allocates it again)."""
        self._array = None


@dataclass(frozen=True, slots=True)
class _Tile:
    """One shard's codes where its band puts them, ready to dequantise."""

    rows: slice  # within the band
    cols: slice
    codes: ColdCodes
    codes_t: torch.Tensor | None  # (rows, blocks a row, BLOCK), int8 or float8; None: NumPy's decode
    scales_t: torch.Tensor | None  # (rows, blocks a row, 1) float32
    clip: bool  # a product may pass float32's largest value (decode clips it back)

    def decode_into(self, band: torch.Tensor) -> None:
        import torch

        out = band[self.rows, self.cols]
        if self.codes_t is None or self.scales_t is None:
            self.codes.decode_into(out.numpy())
            return
        codes = self.codes_t if self.codes_t.dtype == torch.int8 else self.codes_t.to(torch.float32)
        blocked = out.view(out.shape[0], out.shape[1] // BLOCK, BLOCK)  # splits a row: no copy
        torch.mul(codes, self.scales_t, out=blocked)
        if self.clip:
            limit = float(np.finfo(np.float32).max)
            blocked.clamp_(-limit, limit)


def _tile(rows: slice, cols: slice, codes: ColdCodes) -> _Tile:
    """``codes`` as torch views of its payload where one multiplication decodes it."""
    import torch

    height, width = rows.stop - rows.start, cols.stop - cols.start
    if codes.format is ColdFormat.INT4 or width % BLOCK or not height:
        return _Tile(rows, cols, codes, None, None, False)
    payload = torch.from_numpy(codes.payload)
    blocks = height * width // BLOCK
    scales = payload[: 4 * blocks].view(torch.float32)
    raw = payload[4 * blocks :]
    dtype = torch.int8 if codes.format is ColdFormat.INT8 else torch.float8_e4m3fn
    clip = float(scales.abs().max()) * largest_code(codes.format) > float(np.finfo(np.float32).max)
    shape = (height, width // BLOCK)
    return _Tile(rows, cols, codes, raw.view(dtype).view(*shape, BLOCK), scales.view(*shape, 1), clip)


@dataclass(frozen=True, slots=True)
class _Band:
    rows: slice
    tiles: tuple[_Tile, ...]

    @property
    def height(self) -> int:
        return int(self.rows.stop) - int(self.rows.start)


class HeldWeight:
    """One weight's codes, in bands (see the module docstring).

    Parameters
    ----------
    name:
        The weight's base name (for messages).
    shape:
        Its 2-D shape ``(rows, columns)``: ``(out, in)`` of a ``Linear``, ``(vocab, dim)`` of an ``Embedding``.
    tiles:
        ``(rows, columns, codes)`` of each of its shards, covering the shape.
    buffer:
        The base's shared band buffer.
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, int],
        tiles: Sequence[tuple[slice, slice, ColdCodes]],
        buffer: BandBuffer,
    ) -> None:
        self.name = name
        self.shape = shape
        self._buffer = buffer
        by_row: dict[int, list[tuple[slice, slice, ColdCodes]]] = {}
        for rows, cols, codes in tiles:
            by_row.setdefault(rows.start, []).append((rows, cols, codes))
        bands: list[_Band] = []
        start, group = 0, list[tuple[slice, slice, ColdCodes]]()
        for r0 in sorted(by_row):
            height = by_row[r0][0][0].stop - r0
            if group and (r0 + height - start) * shape[1] > buffer.values:
                bands.append(_band(start, group))
                start, group = r0, []
            group += by_row[r0]
        if group:
            bands.append(_band(start, group))
        self._bands = tuple(bands)
        self.nbytes = sum(codes.payload.nbytes for _, _, codes in tiles)
        """Bytes of codes held."""

    def _dequantised(self, wanted: Sequence[_Band] | None = None) -> Iterator[tuple[_Band, torch.Tensor]]:
        """Each band (or each of ``wanted``) dequantised into the shared buffer, in turn: the
        array is valid until the next one is asked for."""
        stats = self._buffer.stats
        with self._buffer._lock:
            for band in self._bands if wanted is None else wanted:
                t0 = time.perf_counter()
                out = self._buffer.band(band.height, self.shape[1])
                for tile in band.tiles:
                    tile.decode_into(out)
                stats.bands += 1
                stats.values += out.numel()
                stats.seconds += time.perf_counter() - t0
                yield band, out

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, mode: str) -> torch.Tensor:
        """``x @ Wᵀ + bias``, band by band of output features (``mode``: unused, every pass is alike)."""
        from torch.nn import functional

        out = x.new_empty((*x.shape[:-1], self.shape[0]))
        for band, values in self._dequantised():
            part = bias[band.rows] if bias is not None else None
            out[..., band.rows] = functional.linear(x, values, part)
        return out

    def input_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad @ W`` (the gradient of ``x @ Wᵀ`` for ``x``), summed band by band."""

        flat = grad.reshape(-1, self.shape[0])
        out = grad.new_zeros((flat.shape[0], self.shape[1]))
        for band, values in self._dequantised():
            out.addmm_(flat[:, band.rows], values)
        return out.reshape(*grad.shape[:-1], self.shape[1])

    def embed(self, ids: torch.Tensor, padding_idx: int | None, mode: str) -> torch.Tensor:
        """The rows ``ids`` of the table, dequantising only the bands that hold one (ids out of
        range raise ``IndexError``, as ``nn.Embedding``'s do). The table is frozen, so
        ``padding_idx`` (which only stops its row's gradient) changes nothing here."""
        import torch

        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.shape[0]):
            raise IndexError(f"index out of range in self ({self.name}: {self.shape[0]} rows)")
        out = torch.empty((flat.numel(), self.shape[1]))
        starts = torch.tensor([band.rows.start for band in self._bands])
        which = torch.bucketize(flat, starts, right=True) - 1  # each id's band
        needed = torch.unique(which).tolist()
        for i, (band, values) in zip(needed, self._dequantised([self._bands[i] for i in needed]), strict=True):
            picked = (which == i).nonzero().reshape(-1)
            out[picked] = values[flat[picked] - band.rows.start]
        return out.reshape(*ids.shape, self.shape[1])


def _band(start: int, tiles: list[tuple[slice, slice, ColdCodes]]) -> _Band:
    stop = max(rows.stop for rows, _, _ in tiles)
    local = tuple(_tile(slice(r.start - start, r.stop - start), c, codes) for r, c, codes in tiles)
    return _Band(slice(start, stop), local)
