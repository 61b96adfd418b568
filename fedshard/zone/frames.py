"""Streamed shards, reassembled: one assembler for pushes, forwards and fetches.

A shard travels as :class:`Chunk` s; the first chunk of each shard also carries its
dtype label and shape. Whoever receives a stream knows from its header what to expect
of every shard: a site's manifest and the round's plan (push), a zone's partial-sum
header (forward), an aggregate summary (fetch). :class:`FrameAssembler` holds the
stream to that :class:`Declared` expectation, with the same checks on every path:

* shards come one after another, each from offset 0, its chunks contiguous;
* a shard is listed in the header and arrives once;
* its dtype label and shape are the declared ones (where the header gives only a
  size, they must be a little-endian numeric dtype and a shape of exactly that size);
* it has no more bytes than declared, and none fewer when the next shard starts or
  the stream ends;
* its digest, where the header gives one, matches;
* every shard the header lists arrives.

A shard that arrives in one chunk is kept as the bytes received (no copy); a larger
one is assembled in a buffer of its final size allocated at its first chunk. Values
are decoded with :func:`numpy.frombuffer` over those bytes. Given ``buffers`` (a zone's
:class:`~fedshard.zone._staging.StagingPool`), every clear shard, even one of a single
chunk, is copied into a buffer taken from it, so the received bytes are freed at once
and the values are read-only views of reused memory. A shard the header says
is ``encrypted`` is HE ciphertext: its first chunk is labelled
:data:`~fedshard.crypto.he.ENCRYPTED_DTYPE` with no shape, and it comes out as ``bytes``
(a larger one joined once from its chunks: ``bytes`` cannot be filled in place).

Failures raise :class:`~fedshard.errors.FrameError` carrying a
:class:`~fedshard.errors.RefusalCode`; the caller says who refused what (and, for a
push, counts nothing of it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from fedshard.crypto.he import ENCRYPTED_DTYPE
from fedshard.errors import FrameError, RefusalCode, ShardError
from fedshard.integrity import ShardHasher, ciphertext_hasher
from fedshard.protocol.rounds import ShardPayload

__all__ = ["Buffer", "Chunk", "Declared", "FrameAssembler", "Header", "shard_chunks"]

Buffer = bytes | bytearray | memoryview
"""Bytes as a transport hands them over (a memoryview must be of bytes, format ``B``)."""


class Header(StrEnum):
    """What declares a stream's shards (named in refusals: "the manifest says …")."""

    PLAN = "plan"
    """The round's shard plan: dtype and shape of a push's clear shards."""
    MANIFEST = "manifest"
    """A site's manifest: the shards of a push, their sizes and digests."""
    HEADER = "header"
    """A zone's partial-sum header: the sums it forwards."""
    SUMMARY = "summary"
    """An aggregate's summary: the shards a fetch receives."""


class Chunk(NamedTuple):
    """One piece of a streamed shard.

    ``dtype`` and ``shape`` label the shard's values; only the first chunk of a shard
    (``offset == 0``) carries them, later ones leave them empty.
    """

    shard_id: str
    offset: int
    data: Buffer
    dtype: str = ""
    shape: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Declared:
    """What a stream's header promises of one shard.

    Attributes
    ----------
    shard_id:
        The shard.
    nbytes:
        Its exact size in bytes.
    digest:
        Its digest (:func:`fedshard.integrity.shard_digest`), checked when given.
    dtype, shape:
        The labels its first chunk must carry; None: any little-endian numeric dtype
        and shape of exactly ``nbytes`` (a fetch: summaries list sizes, not layouts).
        Ignored for ciphertext.
    declared_by:
        What declared the layout (named in refusals).
    encrypted:
        The shard is HE ciphertext bytes, labelled :data:`~fedshard.crypto.he.ENCRYPTED_DTYPE`.
    """

    shard_id: str
    nbytes: int
    digest: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    declared_by: Header = Header.HEADER
    encrypted: bool = False


@dataclass(slots=True)
class _Current:
    declared: Declared
    dtype: np.dtype | None  # None: ciphertext
    shape: tuple[int, ...]
    hasher: ShardHasher
    raw: Buffer | np.ndarray | None  # the one chunk, or the buffer being filled
    parts: list[Buffer] | None = None  # the chunks of a ciphertext of more than one
    received: int = 0


class FrameAssembler:
    """Reassembles and checks one stream of shards against its header (see the module docstring).

    Parameters
    ----------
    declared:
        Shard id → what the header declares of it.
    source:
        What declares the shards, their sizes and digests (named in refusals).
    buffers:
        Gives a writable ``uint8`` buffer of a number of bytes, into which a clear shard
        is assembled (e.g. :meth:`~fedshard.zone._staging.StagingPool.take`; whoever
        gives it takes the buffers back). None: a shard of one chunk is kept as received,
        a larger one assembled in a new ``bytearray``.
    """

    def __init__(
        self,
        declared: Mapping[str, Declared],
        *,
        source: Header,
        buffers: Callable[[int], np.ndarray] | None = None,
    ) -> None:
        self._declared = declared
        self._source = source
        self._buffers = buffers
        self._done: set[str] = set()
        self._current: _Current | None = None

    @property
    def pending(self) -> str | None:
        """The shard whose chunks are arriving, if one is incomplete."""
        return self._current.declared.shard_id if self._current is not None else None

    def add(self, chunk: Chunk) -> tuple[str, ShardPayload] | None:
        """Take one chunk; the shard id and values (ciphertext: bytes) of the shard it completes, if it does.

        Raises
        ------
        FrameError
            The chunk breaks what the header declared (see the module docstring).
        """
        current = self._current
        if current is None or current.declared.shard_id != chunk.shard_id:
            if current is not None:
                sid = current.declared.shard_id
                raise FrameError(f"shard {sid} ended after {current.received} bytes", RefusalCode.TRUNCATED)
            current = self._current = self._start(chunk)
        size = len(chunk.data)
        if chunk.offset != current.received:
            raise FrameError(
                f"shard {chunk.shard_id}: chunk at offset {chunk.offset}, expected {current.received}",
                RefusalCode.OFFSET,
            )
        declared = current.declared
        if current.received + size > declared.nbytes:
            raise FrameError(
                f"shard {chunk.shard_id}: more than the {declared.declared_by}'s {declared.nbytes} bytes",
                RefusalCode.SHAPE,
            )
        current.hasher.update(chunk.data)
        if current.parts is not None:
            current.parts.append(chunk.data)
        elif current.raw is None:  # the whole shard in this chunk: keep it as received
            current.raw = chunk.data
        else:  # filling the shard's buffer
            raw = current.raw
            dest = raw.data if isinstance(raw, np.ndarray) else memoryview(raw)
            dest[current.received : current.received + size] = chunk.data
        current.received += size
        return self._complete(current) if current.received == declared.nbytes else None

    def finish(self) -> None:
        """The stream ended: raise :class:`FrameError` unless every declared shard arrived whole."""
        if self._current is not None:
            raise FrameError(f"shard {self._current.declared.shard_id} is incomplete", RefusalCode.TRUNCATED)
        missing = [sid for sid in self._declared if sid not in self._done]
        if missing:
            raise FrameError(
                f"{len(missing)} shard(s) of the {self._source} never arrived, e.g. {missing[0]}", RefusalCode.MISSING
            )

    def _start(self, chunk: Chunk) -> _Current:
        sid = chunk.shard_id
        if sid in self._done:
            raise FrameError(f"shard {sid} sent twice", RefusalCode.DUPLICATE)
        declared = self._declared.get(sid)
        if declared is None:
            raise FrameError(f"shard {sid} is not listed in the {self._source}", RefusalCode.UNKNOWN_SHARD)
        if chunk.offset != 0:
            raise FrameError(f"shard {sid} starts at offset {chunk.offset}, expected 0", RefusalCode.OFFSET)
        whole = len(chunk.data) >= declared.nbytes  # kept as it is; otherwise assembled
        if declared.encrypted:
            if chunk.dtype != ENCRYPTED_DTYPE:
                raise FrameError(
                    f"shard {sid} has dtype {chunk.dtype or '?'}, the {declared.declared_by} says {ENCRYPTED_DTYPE}",
                    RefusalCode.DTYPE,
                )
            if chunk.shape:
                raise FrameError(f"shard {sid} is ciphertext, which has no shape; got {chunk.shape}", RefusalCode.SHAPE)
            return _Current(declared, None, (), ciphertext_hasher(declared.nbytes), None, None if whole else [])
        dtype, shape = _layout(declared, chunk.dtype, tuple(chunk.shape))
        raw: bytearray | np.ndarray | None
        if self._buffers is not None:
            raw = self._buffers(declared.nbytes)
        else:
            raw = None if whole else bytearray(declared.nbytes)
        return _Current(declared, dtype, shape, ShardHasher(dtype.str, shape), raw)

    def _complete(self, current: _Current) -> tuple[str, ShardPayload]:
        self._current = None
        declared = current.declared
        self._done.add(declared.shard_id)
        if declared.digest is not None and current.hasher.hexdigest() != declared.digest:
            raise FrameError(f"shard {declared.shard_id}: digest does not match the {self._source}", RefusalCode.DIGEST)
        if current.dtype is None:  # ciphertext
            data = b"".join(current.parts) if current.parts is not None else current.raw or b""
            return declared.shard_id, data if isinstance(data, bytes) else bytes(data)
        if isinstance(current.raw, np.ndarray):  # a buffer given to this assembler: staged read-only
            values = current.raw.view(current.dtype).reshape(current.shape)
            values.flags.writeable = False
            return declared.shard_id, values
        raw = current.raw if current.raw is not None else b""
        return declared.shard_id, np.frombuffer(raw, dtype=current.dtype).reshape(current.shape)


def _layout(declared: Declared, label: str, shape: tuple[int, ...]) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of a shard from its first chunk's labels, checked against the header."""
    sid = declared.shard_id
    try:
        dtype: np.dtype | None = np.dtype(label) if label else None
    except TypeError:
        dtype = None
    if declared.dtype is not None:
        if dtype is None or dtype != np.dtype(declared.dtype):
            raise FrameError(
                f"shard {sid} has dtype {label or '?'}, the {declared.declared_by} says {declared.dtype}",
                RefusalCode.DTYPE,
            )
        if declared.shape is not None and shape != declared.shape:
            raise FrameError(
                f"shard {sid} has shape {shape}, the {declared.declared_by} says {declared.shape}", RefusalCode.SHAPE
            )
        return np.dtype(declared.dtype), declared.shape if declared.shape is not None else shape
    if dtype is None or dtype.kind not in "biufc" or dtype.byteorder == ">":
        raise FrameError(f"shard {sid} has dtype {label or '?'}, not a little-endian number type", RefusalCode.DTYPE)
    if math.prod(shape) * dtype.itemsize != declared.nbytes:
        raise FrameError(
            f"shard {sid}: dtype {label} and shape {shape} make {math.prod(shape) * dtype.itemsize} bytes, "
            f"the {declared.declared_by} says {declared.nbytes}",
            RefusalCode.SHAPE,
        )
    return dtype, shape


def shard_chunks(
    shard_id: str, value: ShardPayload, chunk_bytes: int | None = None, *, encrypted: bool = False
) -> Iterator[Chunk]:
    """Cut one shard into chunks of at most ``chunk_bytes`` (None: one chunk), without copying.

    The first chunk carries the labels: an array's dtype (little-endian; big-endian
    arrays are converted first) and shape, or :data:`~fedshard.crypto.he.ENCRYPTED_DTYPE`
    for ciphertext. ``encrypted`` says which the shard is (its header's flag).

    Raises
    ------
    ShardError
        Ciphertext bytes for a shard in clear, or an encrypted shard that is not bytes.
    """
    if encrypted:
        if not isinstance(value, bytes):
            raise ShardError(
                f"shard {shard_id} is listed as encrypted but holds {value.dtype} values, not ciphertext bytes"
            )
        yield from _cut(shard_id, value, chunk_bytes, ENCRYPTED_DTYPE, ())
        return
    if isinstance(value, bytes):
        raise ShardError(f"shard {shard_id}: ciphertext bytes for a shard its header lists in clear")
    arr = np.ascontiguousarray(value)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    raw = arr.reshape(-1).view(np.uint8).data  # not memoryview.cast("B"): it refuses zero-size arrays
    yield from _cut(shard_id, raw, chunk_bytes, arr.dtype.str, tuple(int(d) for d in arr.shape))


def _cut(shard_id: str, data: Buffer, chunk_bytes: int | None, dtype: str, shape: tuple[int, ...]) -> Iterator[Chunk]:
    size = len(data)
    if chunk_bytes is None or size <= chunk_bytes:
        yield Chunk(shard_id, 0, data, dtype, shape)
        return
    view = memoryview(data)
    yield Chunk(shard_id, 0, view[:chunk_bytes], dtype, shape)
    for offset in range(chunk_bytes, size, chunk_bytes):
        yield Chunk(shard_id, offset, view[offset : offset + chunk_bytes])
