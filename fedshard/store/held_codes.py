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
for int8), a band's buffer is all (1 MiB). Dequantising happens in the computing thread,
with torch's own threads: a band of int8 or fp8 codes is repacked at attach into one
array of codes and one of its blocks' scales, so one multiplication dequantises it (the
same float32 products as :func:`~fedshard.store.quantize.decode`, bit for bit); int4 and
tiles whose rows do not hold whole blocks go through NumPy, tile by tile. No prefetch
thread competes with torch's for the cores. The bands of one
:class:`BandBuffer` are used one at a time: it is one training thread's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedshard.errors import StoreError
from fedshard.store._shard_io import ColdCodes
from fedshard.store.quantize import BLOCK, ColdFormat, largest_code

if TYPE_CHECKING:
    import torch

__all__ = ["BAND_VALUES", "BandBuffer", "HeldStats", "HeldWeight"]

BAND_VALUES = 1 << 18
"""Most values a band holds when it spans more than one tile row (1 MiB of float32). Smaller
bands mean smaller short-lived products too: on the 118 M base (``bench/llm_stream.py``) a
training step's peak resident size was 30–45 MB lower at 256 Ki values than at 1 Mi, for
about the same step time; glibc keeps more of the larger products' freed memory."""


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
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a band is in use: one band at a time, whichever thread computes."""
    _array: torch.Tensor | None = None

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
class _Packed:
    """A band's int8 or fp8 codes repacked at attach into one array, with its blocks' scales:
    one multiplication dequantises the whole band."""

    codes: torch.Tensor  # (rows, blocks a row, BLOCK): int8, or fp8's bytes as float8_e4m3fn
    scales: torch.Tensor  # (rows, blocks a row, 1) float32
    clip: bool  # a product may pass float32's largest value (decode clips it back)

    def decode_into(self, band: torch.Tensor) -> None:
        import torch

        blocked = band.view(self.codes.shape)
        if self.codes.dtype == torch.int8:
            torch.mul(self.codes, self.scales, out=blocked)  # a code widens exactly: one float32 product
        else:
            blocked.copy_(self.codes)  # float8 → float32 is exact
            blocked.mul_(self.scales)
        if self.clip:
            limit = float(np.finfo(np.float32).max)
            blocked.clamp_(-limit, limit)


@dataclass(frozen=True, slots=True)
class _Band:
    rows: slice
    tiles: tuple[tuple[slice, slice, ColdCodes], ...]  # (rows within the band, columns, codes); () when packed
    packed: _Packed | None

    @property
    def height(self) -> int:
        return int(self.rows.stop) - int(self.rows.start)

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.codes.nbytes + self.packed.scales.nbytes
        return sum(codes.payload.nbytes for _, _, codes in self.tiles)

    def decode_into(self, out: torch.Tensor) -> None:
        if self.packed is not None:
            self.packed.decode_into(out)
            return
        for rows, cols, codes in self.tiles:
            codes.decode_into(out[rows, cols].numpy())


Layout = tuple[slice, slice, str]
"""Where one shard of a weight lies: its rows, its columns and its id."""


def _band(start: int, width: int, fmt: ColdFormat, tiles: list[Layout], read: Callable[[str], ColdCodes]) -> _Band:
    """The band of ``tiles`` (whole tile rows from row ``start``): packed where every tile's rows hold
    whole blocks of an int8 or fp8 code, each tile's codes copied in as it is read and dropped (so
    attaching holds at most one tile twice); else the tiles' codes as read."""
    import torch

    stop = max(rows.stop for rows, _, _ in tiles)
    local = [(slice(r.start - start, r.stop - start), c, shard) for r, c, shard in tiles]
    packable = fmt is not ColdFormat.INT4 and not width % BLOCK
    packable = packable and all((c.stop - c.start) % BLOCK == 0 and c.start % BLOCK == 0 for _, c, _ in local)
    if not packable:
        return _Band(slice(start, stop), tuple((r, c, read(shard)) for r, c, shard in local), None)
    height = stop - start
    raw = np.empty((height, width), dtype=np.uint8)
    scales = np.empty((height, width // BLOCK), dtype=np.float32)
    for rows, cols, shard in local:
        codes = read(shard)
        if codes.format is not fmt:
            raise StoreError(f"shard {shard} is stored {codes.format.value}, the base records {fmt.value}")
        h, w = rows.stop - rows.start, cols.stop - cols.start
        blocks = h * w // BLOCK
        scales[rows, cols.start // BLOCK : cols.stop // BLOCK] = (
            codes.payload[: 4 * blocks].view(np.float32).reshape(h, w // BLOCK)
        )
        raw[rows, cols] = codes.payload[4 * blocks :].reshape(h, w)
        del codes
    clip = float(np.abs(scales).max(initial=0.0)) * largest_code(fmt) > float(np.finfo(np.float32).max)
    dtype = torch.int8 if fmt is ColdFormat.INT8 else torch.float8_e4m3fn
    shape = (height, width // BLOCK)
    packed = _Packed(
        torch.from_numpy(raw).view(dtype).view(*shape, BLOCK), torch.from_numpy(scales).view(*shape, 1), clip
    )
    return _Band(slice(start, stop), (), packed)


class HeldWeight:
    """One weight's codes, in bands (see the module docstring).

    Parameters
    ----------
    name:
        The weight's base name (for messages).
    shape:
        Its 2-D shape ``(rows, columns)``: ``(out, in)`` of a ``Linear``, ``(vocab, dim)`` of an ``Embedding``.
    fmt:
        The cold format its shards are stored in.
    tiles:
        ``(rows, columns, shard id)`` of each of its shards, covering the shape.
    read:
        Reads one shard's codes, checked (:meth:`~fedshard.store.sealed_store.SealedShardStore.cold_codes`).
    buffer:
        The base's shared band buffer.

    Raises
    ------
    ShardIntegrityError
        A shard fails its read checks (from ``read``).
    StoreError
        A shard is stored in another format than ``fmt``.
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, int],
        fmt: ColdFormat,
        tiles: Sequence[Layout],
        read: Callable[[str], ColdCodes],
        buffer: BandBuffer,
    ) -> None:
        self.name = name
        self.shape = shape
        self._buffer = buffer
        by_row: dict[int, list[Layout]] = {}
        for rows, cols, shard in tiles:
            by_row.setdefault(rows.start, []).append((rows, cols, shard))
        bands: list[_Band] = []
        start, group = 0, list[Layout]()
        for r0 in sorted(by_row):
            height = by_row[r0][0][0].stop - r0
            if group and (r0 + height - start) * shape[1] > buffer.values:
                bands.append(_band(start, shape[1], fmt, group, read))
                start, group = r0, []
            group += by_row[r0]
        if group:
            bands.append(_band(start, shape[1], fmt, group, read))
        self._bands = tuple(bands)
        self._starts: torch.Tensor | None = None  # each band's first row, for lookups (made on the first)
        self.nbytes = sum(band.nbytes for band in self._bands)
        """Bytes of codes held (and their scales)."""

    def _dequantised(self, wanted: Sequence[_Band] | None = None) -> Iterator[tuple[_Band, torch.Tensor]]:
        """Each band (or each of ``wanted``) dequantised into the shared buffer, in turn: the
        array is valid until the next one is asked for."""
        stats = self._buffer.stats
        with self._buffer.lock:
            for band in self._bands if wanted is None else wanted:
                t0 = time.perf_counter()
                out = self._buffer.band(band.height, self.shape[1])
                band.decode_into(out)
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
        if self._starts is None:
            self._starts = torch.tensor([band.rows.start for band in self._bands])
        which = torch.bucketize(flat, self._starts, right=True) - 1  # each id's band
        needed = torch.unique(which).tolist()
        for i, (band, values) in zip(needed, self._dequantised([self._bands[i] for i in needed]), strict=True):
            picked = (which == i).nonzero().reshape(-1)
            out[picked] = values[flat[picked] - band.rows.start]
        return out.reshape(*ids.shape, self.shape[1])
