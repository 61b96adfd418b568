"""Shard plans: how a model's tensors are cut into gradient shards.

A :class:`ShardPlan` is derived from a model's ``state_dict`` (names, shapes,
dtypes; never values). Tensors whose 2-D view exceeds the tile are cut into tiles;
smaller tensors are one shard. An N-D tensor is viewed as 2-D by its first
dimension: ``(shape[0], prod(shape[1:]))``; a 1-D tensor of length n is ``(n, 1)``
and a scalar ``(1, 1)``.

Shard ids are ``"<tensor name>#r<row tile>c<column tile>"`` (``fc1.weight#r0c1``)
and never change for a given plan. ``split`` and ``join`` round-trip bit-exactly.
The plan serialises to canonical JSON and has a digest, so parties can check they
share it before exchanging shards.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedshard.errors import ShardError
from fedshard.integrity.canonical import canonical_text

__all__ = ["DEFAULT_TILE", "ShardPlan", "ShardSpec", "TensorSpec", "as_numpy"]

DEFAULT_TILE: tuple[int, int] = (256, 256)
_PLAN_FORMAT = 1


def as_numpy(value: Any) -> np.ndarray:
    """Return ``value`` (NumPy array or torch tensor) as a NumPy array, without copying when possible."""
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is not None:  # a torch.Tensor; torch is not imported here on purpose
        array: np.ndarray = detach().cpu().numpy()
        return array
    return np.asarray(value)


def _view2d(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return (1, 1)
    return (shape[0], math.prod(shape[1:]))


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, shape and dtype of one tensor of the model."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # NumPy dtype string, little-endian, e.g. "<f4"

    @property
    def view2d(self) -> tuple[int, int]:
        """The 2-D view (rows, columns) that tiling works on."""
        return _view2d(self.shape)


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard: which tensor, which tile, and the tile's 2-D shape."""

    shard_id: str
    tensor: str
    rows: slice
    cols: slice
    dtype: str

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of the shard array (always 2-D)."""
        return (self.rows.stop - self.rows.start, self.cols.stop - self.cols.start)

    @property
    def size(self) -> int:
        """Number of values in the shard."""
        rows, cols = self.shape
        return rows * cols

    @property
    def nbytes(self) -> int:
        """Number of bytes of the shard's values."""
        return self.size * np.dtype(self.dtype).itemsize


class ShardPlan:
    """How a model's tensors map to shards.

    Parameters
    ----------
    tensors:
        The model's tensors in ``state_dict`` order.
    tile:
        Maximum ``(rows, columns)`` of one shard.
    """

    def __init__(self, tensors: list[TensorSpec], tile: tuple[int, int] = DEFAULT_TILE) -> None:
        if len(tile) != 2 or tile[0] < 1 or tile[1] < 1:
            raise ShardError(f"tile must be two positive integers, got {tile!r}")
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            raise ShardError("tensor names in a shard plan must be unique")
        for name in names:
            if "#" in name:
                raise ShardError(f"tensor name {name!r} contains '#', which shard ids reserve")
        self.tensors: tuple[TensorSpec, ...] = tuple(tensors)
        self.tile: tuple[int, int] = (int(tile[0]), int(tile[1]))
        self._by_tensor: dict[str, list[ShardSpec]] = {}
        self._shards: dict[str, ShardSpec] = {}
        for spec in self.tensors:
            tiles = list(self._tiles(spec))
            self._by_tensor[spec.name] = tiles
            for shard in tiles:
                self._shards[shard.shard_id] = shard
        self._digest: str | None = None

    # construction -------------------------------------------------------------------
    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, Any], tile: tuple[int, int] = DEFAULT_TILE) -> ShardPlan:
        """Build the plan for the floating-point tensors of ``state_dict``.

        Integer buffers (e.g. BatchNorm's ``num_batches_tracked``) are not shards:
        they are not averaged.
        """
        specs = []
        for name, value in state_dict.items():
            array = as_numpy(value)
            if not np.issubdtype(array.dtype, np.floating):
                continue
            specs.append(TensorSpec(name, tuple(int(d) for d in array.shape), array.dtype.newbyteorder("<").str))
        return cls(specs, tile)

    def _tiles(self, spec: TensorSpec) -> list[ShardSpec]:
        rows, cols = spec.view2d
        tile_rows, tile_cols = self.tile
        out = []
        for i, r0 in enumerate(range(0, max(rows, 1), tile_rows)):
            for j, c0 in enumerate(range(0, max(cols, 1), tile_cols)):
                out.append(
                    ShardSpec(
                        shard_id=f"{spec.name}#r{i}c{j}",
                        tensor=spec.name,
                        rows=slice(r0, min(r0 + tile_rows, rows)),
                        cols=slice(c0, min(c0 + tile_cols, cols)),
                        dtype=spec.dtype,
                    )
                )
        return out

    # lookup ---------------------------------------------------------------------------
    @property
    def shard_ids(self) -> list[str]:
        """All shard ids, in plan order."""
        return list(self._shards)

    @property
    def shards(self) -> list[ShardSpec]:
        """All shard specs, in plan order."""
        return list(self._shards.values())

    def shard(self, shard_id: str) -> ShardSpec:
        """Return the spec of ``shard_id``; raise :class:`ShardError` if it is not in the plan."""
        try:
            return self._shards[shard_id]
        except KeyError:
            raise ShardError(f"shard {shard_id!r} is not in the shard plan") from None

    def __contains__(self, shard_id: object) -> bool:
        return shard_id in self._shards

    def __len__(self) -> int:
        return len(self._shards)

    @property
    def num_values(self) -> int:
        """Total number of values across all shards."""
        return sum(s.size for s in self._shards.values())

    @property
    def nbytes(self) -> int:
        """Total bytes across all shards."""
        return sum(s.nbytes for s in self._shards.values())

    # split / join ---------------------------------------------------------------------
    def split(self, tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Cut a full set of tensors (update or parameters) into ``{shard_id: 2-D array}``.

        Arrays are contiguous, little-endian copies in the plan's dtype.
        """
        out: dict[str, np.ndarray] = {}
        for spec in self.tensors:
            if spec.name not in tensors:
                raise ShardError(f"tensor {spec.name!r} of the shard plan is missing from the update")
            array = as_numpy(tensors[spec.name])
            if tuple(array.shape) != spec.shape:
                raise ShardError(f"tensor {spec.name!r} has shape {tuple(array.shape)}, the plan says {spec.shape}")
            if array.dtype.newbyteorder("<") != np.dtype(spec.dtype):
                raise ShardError(f"tensor {spec.name!r} has dtype {array.dtype}, the plan says {spec.dtype}")
            view = array.reshape(spec.view2d)
            for shard in self._by_tensor[spec.name]:
                # copy=True: a one-tile tensor would otherwise come back as a view of the
                # caller's array, and writing to the shard would change the model.
                out[shard.shard_id] = np.array(view[shard.rows, shard.cols], dtype=spec.dtype, order="C", copy=True)
        return out

    def join(self, shards: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Reassemble ``{shard_id: array}`` into ``{tensor name: array}`` of the original shapes."""
        out: dict[str, np.ndarray] = {}
        for spec in self.tensors:
            full = np.empty(spec.view2d, dtype=spec.dtype)
            for shard in self._by_tensor[spec.name]:
                if shard.shard_id not in shards:
                    raise ShardError(f"shard {shard.shard_id!r} is missing; cannot rebuild {spec.name!r}")
                piece = np.asarray(shards[shard.shard_id])
                if piece.shape != shard.shape:
                    raise ShardError(f"shard {shard.shard_id!r} has shape {piece.shape}, the plan says {shard.shape}")
                full[shard.rows, shard.cols] = piece
            out[spec.name] = full.reshape(spec.shape)
        return out

    # identity ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-data form of the plan (what :meth:`to_json` writes)."""
        return {
            "format": _PLAN_FORMAT,
            "tile": list(self.tile),
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in self.tensors],
        }

    def to_json(self) -> str:
        """Canonical JSON: the same plan always serialises to the same bytes."""
        return canonical_text(self.to_dict(), allow_nan=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ShardPlan:
        """Read a plan written by :meth:`to_json`."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ShardError(f"not a valid shard plan: expected a JSON object, got {type(data).__name__}")
            if data.get("format") != _PLAN_FORMAT:
                raise ShardError(f"unsupported shard plan format {data.get('format')!r}")
            tensors = [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in data["tensors"]]
            return cls(tensors, tuple(data["tile"]))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ShardError):
                raise
            raise ShardError(f"not a valid shard plan: {exc}") from None

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the canonical JSON."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.to_json().encode()).hexdigest()
        return self._digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardPlan) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"ShardPlan({len(self.tensors)} tensors, {len(self)} shards, tile={self.tile})"
