"""A frozen base streamed from the sealed store: train adapters without holding the fp32 base (QLoRA-style).

Two halves:

* :func:`seal_base` writes a module's frozen tensors into a
  :class:`~fedshard.store.sealed_store.SealedShardStore` in one commit: the weights of
  its ``nn.Linear`` and ``nn.Embedding`` modules cold (int8 by default, or fp8/int4),
  every other frozen tensor (biases, LayerNorm, buffers) at full precision. The store's
  ``frozen_base`` metadata records the shard plan and which tensors are streamed.
* :class:`StreamedBase` attaches such a store to a module of the same architecture
  (built normally, or on the ``meta`` device so the fp32 base is never allocated). The
  small tensors are loaded once and stay resident; each streamed ``Linear`` /
  ``Embedding`` is replaced by :class:`StreamedLinear` / :class:`StreamedEmbedding`,
  which hold no weight: their forward takes the dequantised fp32 weight from a
  :class:`~fedshard.store.weight_stream.WeightStream` (background prefetch in the order
  of the previous pass, at most ``lookahead + 1`` weights resident) and drops it after
  use. ``StreamedLinear`` runs through an autograd function that saves no weight: its
  backward takes the weight again and returns the gradient for the input only (a frozen
  weight gets none).

Where a fetch takes a weight from (:class:`Codes`):

* ``memory`` (the default): each streamed weight's shards are read once, when the store is
  attached, with every check of a store read (the AES-GCM tag, the BLAKE3 digest), and
  their cold codes are kept in memory (int8 and fp8: 1 + 1/16 bytes a value, 26.6 % of
  fp32; int4 14 %) as a :class:`~fedshard.store.held_codes.HeldWeight`, which the layer
  computes with a band of rows at a time, dequantised in the computing thread (no
  full-precision weight, no prefetch thread). A tampered blob raises
  :class:`~fedshard.errors.ShardIntegrityError` at attach.
* ``store``: nothing is kept; every fetch of a whole weight, through the
  :class:`~fedshard.store.weight_stream.WeightStream`, is a store read (decrypt, dequantise, and on a
  shard's first read the BLAKE3 digest check), so a blob tampered with later raises in
  the forward or backward that needs it. The least memory (a few layers); a read costs some
  20 times a dequantisation (``bench/llm_stream.py``).

Adapters: ``peft`` LoRA works both ways round. Injected *before* streaming, the
``lora.Linear``'s ``base_layer`` is replaced; injected *after*, peft wraps the
``StreamedLinear`` (an ``nn.Linear``). peft reads the base layer's ``weight`` only for its
shape, dtype and device; a streamed module's ``weight`` is an :class:`AbsentWeight`,
which answers those and raises on anything else.
Stored names are the base model's: peft's ``base_layer.`` segments are removed, so a
base sealed before injection attaches after it and vice versa. Merging adapters into
the base (``merge``) needs the weight and is not supported on a streamed module.

Stability contract of the ``frozen_base`` metadata (version 1): ``plan`` (the shard plan
JSON of every stored base tensor), ``streamed`` (names of the tensors stored cold and
streamed) and ``format`` (their cold format); a stored record never changes meaning.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from fedshard.errors import ShardError, StoreError
from fedshard.sharding.plan import DEFAULT_TILE, ShardPlan, TensorSpec
from fedshard.store.held_codes import BAND_VALUES, BandBuffer, HeldStats, HeldWeight
from fedshard.store.model_io import plan_of
from fedshard.store.quantize import ColdFormat
from fedshard.store.sealed_store import SealedShardStore
from fedshard.store.weight_stream import StreamStats, WeightStream

__all__ = [
    "BASE_META",
    "AbsentWeight",
    "Codes",
    "StreamedBase",
    "StreamedEmbedding",
    "StreamedLinear",
    "base_name",
    "seal_base",
]

BASE_META = "frozen_base"
_META_VERSION = 1
_WRAPPER = "base_layer"  # peft's attribute for the wrapped module


class Codes(StrEnum):
    """Where a streamed weight's cold codes are read from at each use (see the module docstring)."""

    MEMORY = "memory"
    STORE = "store"


def base_name(name: str) -> str:
    """The base model's name of a tensor: ``blocks.0.qkv.base_layer.weight`` → ``blocks.0.qkv.weight``."""
    return ".".join(part for part in name.split(".") if part != _WRAPPER)


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where a tensor lives in a module: its owner, the attribute, and what it is."""

    owner: nn.Module
    attr: str
    tensor: torch.Tensor
    is_param: bool


def _slots(module: nn.Module) -> Iterator[tuple[str, _Slot]]:
    """``(base name, slot)`` of every parameter and buffer, in ``state_dict`` order."""
    for prefix, owner in module.named_modules():
        for attr, p in owner.named_parameters(recurse=False):
            yield base_name(f"{prefix}.{attr}" if prefix else attr), _Slot(owner, attr, p, True)
        for attr, b in owner.named_buffers(recurse=False):
            if b is not None:
                yield base_name(f"{prefix}.{attr}" if prefix else attr), _Slot(owner, attr, b, False)


def _adapter_tensors(module: nn.Module) -> set[int]:
    """Ids of the tensors of ``peft`` adapters (frozen ones included, e.g. FFA-LoRA's A), found by
    peft's own lists of adapter attributes (``adapter_layer_names``, ``other_param_names``)."""
    ids: set[int] = set()
    for layer in module.modules():
        for attr in (*getattr(layer, "adapter_layer_names", ()), *getattr(layer, "other_param_names", ())):
            held = getattr(layer, attr, None)
            if isinstance(held, nn.Module):
                ids.update(id(t) for t in held.parameters())
                ids.update(id(t) for t in held.buffers())
    return ids


def _frozen(module: nn.Module) -> dict[str, _Slot]:
    """The base's tensors: floating-point parameters that do not train and floating-point buffers,
    adapters excepted."""
    adapters = _adapter_tensors(module)
    out: dict[str, _Slot] = {}
    for name, slot in _slots(module):
        if slot.tensor.is_floating_point() and not slot.tensor.requires_grad and id(slot.tensor) not in adapters:
            out[name] = slot
    return out


def _streamable(slot: _Slot) -> bool:
    return slot.attr == "weight" and isinstance(slot.owner, (nn.Linear, nn.Embedding))


def seal_base(
    module: nn.Module,
    store: SealedShardStore,
    fmt: ColdFormat = ColdFormat.INT8,
    *,
    tile: tuple[int, int] = DEFAULT_TILE,
) -> ShardPlan:
    """Write ``module``'s frozen tensors into ``store`` in one commit and record them as its base.

    Freeze the base first (``add_lora`` does; or ``module.requires_grad_(False)``):
    tensors that require grad (adapters) are not written. ``Linear`` and ``Embedding``
    weights go cold in ``fmt`` (they are what :class:`StreamedBase` streams); the other
    frozen tensors at full precision. One tensor is converted at a time.

    Returns
    -------
    ShardPlan
        The plan of the stored tensors (base names; see :func:`base_name`).
    """
    frozen = _frozen(module)
    if not frozen:
        raise StoreError("the module has no frozen tensors: freeze the base before sealing it")
    plan = plan_of(((n, tuple(s.tensor.shape), "<f4") for n, s in frozen.items()), tile)
    for name, slot in frozen.items():
        if slot.tensor.dtype != torch.float32 or slot.tensor.is_meta:
            raise StoreError(f"tensor {name!r} is {slot.tensor.dtype} on {slot.tensor.device}: seal a float32 CPU base")
    streamed = [n for n, s in frozen.items() if _streamable(s)]
    specs = {t.name: t for t in plan.tensors}
    with store.batch():
        for name, slot in frozen.items():
            sub = ShardPlan([specs[name]], plan.tile)  # the same shard ids as the full plan
            shards = sub.split({name: slot.tensor.detach().cpu().numpy()})
            if name in streamed:
                store.put_cold(shards, fmt)
            else:
                store.put_many(shards)
        doc = {"version": _META_VERSION, "plan": plan.to_json(), "streamed": streamed, "format": fmt.value}
        store.set_meta(BASE_META, doc)
    return plan


# the streamed modules ---------------------------------------------------------------------------
_PROBES: set[Any] = {  # what probing a tensor calls: reading these attributes, and three methods
    *(getattr(torch.Tensor, attr).__get__ for attr in ("dtype", "device", "shape", "ndim", "is_meta", "requires_grad")),
    torch.Tensor.size,
    torch.Tensor.dim,
    torch.Tensor.is_floating_point,
}


class AbsentWeight(torch.Tensor):
    """What a streamed module shows as its ``weight``: shape, dtype and device, no values.

    Code that probes a layer (``peft`` asks for the base layer's device and dtype) gets
    answers; any computation with it raises :class:`StoreError` instead of silently
    using made-up values. It occupies one float (a zero-stride view).
    """

    @classmethod
    def make(cls, shape: tuple[int, ...], name: str) -> AbsentWeight:
        """The stand-in for the streamed tensor ``name`` of ``shape``."""
        weight = torch.Tensor._make_subclass(cls, torch.zeros(()).expand(*shape))
        weight.streamed_name = name  # type: ignore[attr-defined]
        return weight

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _PROBES:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        name = getattr(args[0], "streamed_name", "a streamed weight") if args else "a streamed weight"
        raise StoreError(
            f"{getattr(func, '__name__', func)} on {name}: the weight is streamed from the sealed store and not "
            "held by the module (only its shape, dtype and device can be read)"
        )

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        return f"AbsentWeight({getattr(self, 'streamed_name', '?')})"


class WeightSource(Protocol):
    """Where a streamed layer's frozen weight comes from when it computes: the
    :class:`~fedshard.store.weight_stream.WeightStream` (:class:`_Fetched`, whole weights from
    the store) or codes held in memory (:class:`~fedshard.store.held_codes.HeldWeight`)."""

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, mode: str) -> torch.Tensor:
        """``x @ Wᵀ + bias``; ``mode``: ``train`` or ``eval`` (the stream keeps a schedule per mode)."""
        ...

    def input_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad @ W``: the gradient of ``x @ Wᵀ`` for ``x``."""
        ...

    def embed(self, ids: torch.Tensor, padding_idx: int | None, mode: str) -> torch.Tensor:
        """The rows ``ids`` of the table."""
        ...


@dataclass(frozen=True, slots=True)
class _Fetched:
    """A weight taken whole from the stream each time it is needed, and dropped after."""

    name: str
    stream: WeightStream

    def _take(self, mode: str, phase: str) -> torch.Tensor:
        return torch.from_numpy(self.stream.take((mode, phase, self.name)))

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, mode: str) -> torch.Tensor:
        return nn.functional.linear(x, self._take(mode, "fwd"), bias)

    def input_grad(self, grad: torch.Tensor) -> torch.Tensor:
        return grad @ self._take("train", "bwd")

    def embed(self, ids: torch.Tensor, padding_idx: int | None, mode: str) -> torch.Tensor:
        return nn.functional.embedding(ids, self._take(mode, "fwd"), padding_idx)


class _FrozenLinear(torch.autograd.Function):
    """``x @ Wᵀ + b`` with ``W`` taken from the layer's source in forward and again in backward; saves no weight."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor | None, layer: StreamedLinear, mode: str) -> torch.Tensor:
        ctx.layer = layer
        return layer.source.linear(x, bias, mode)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return ctx.layer.source.input_grad(grad), None, None, None


class StreamedLinear(nn.Linear):
    """A frozen ``nn.Linear`` whose weight lives in the sealed store.

    ``weight`` is an :class:`AbsentWeight` (probes only). The bias stays resident and
    frozen. Made by :class:`StreamedBase`.
    """

    def __init__(self, linear: nn.Linear, name: str, source: WeightSource) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: that would allocate a weight
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.name = name
        self.source = source
        self.bias = linear.bias  # resident, frozen (loaded from the store before the swap)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """An :class:`AbsentWeight`: shape ``(out, in)``, float32, CPU; no values."""
        return AbsentWeight.make((self.out_features, self.in_features), self.name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ Wᵀ + b`` (gradient for ``x`` only)."""
        mode = "train" if torch.is_grad_enabled() else "eval"  # decided here: Function.forward runs without grad
        out: torch.Tensor = _FrozenLinear.apply(x, self.bias, self, mode)  # type: ignore[no-untyped-call]
        return out

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}, streamed={self.name!r}"


class StreamedEmbedding(nn.Module):
    """A frozen ``nn.Embedding`` whose table lives in the sealed store.

    ``weight`` is an :class:`AbsentWeight`, for code that probes the table's dtype
    (``x.to(emb.weight.dtype)``); computing with it fails loudly.
    Token ids need no gradient and the table gets none, so backward never fetches it.
    """

    def __init__(self, embedding: nn.Embedding, name: str, source: WeightSource) -> None:
        super().__init__()
        self.num_embeddings = embedding.num_embeddings
        self.embedding_dim = embedding.embedding_dim
        self.padding_idx = embedding.padding_idx
        self.max_norm = embedding.max_norm
        if self.max_norm is not None:
            raise StoreError(f"embedding {name!r} has max_norm, which renormalises its (frozen) table in place")
        self.name = name
        self.source = source

    @property
    def weight(self) -> torch.Tensor:
        """An :class:`AbsentWeight`: shape and dtype only (the values are in the store)."""
        return AbsentWeight.make((self.num_embeddings, self.embedding_dim), self.name)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the table for ``ids``."""
        mode = "train" if torch.is_grad_enabled() else "eval"
        return self.source.embed(ids, self.padding_idx, mode)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, streamed={self.name!r}"


# attaching a store ------------------------------------------------------------------------------------
class _Buffers:
    """Spare float32 buffers for fetched weights, so a fetch reuses pages instead of faulting in new ones.

    A weight's buffer comes back when its last reference dies (a finalizer); it is kept
    for the next weight of the same size while the spares total at most ``spare_bytes``,
    else freed. Reused pages skip the kernel's page faults and zeroing (measured: about a
    quarter of a fetch's cost).
    """

    def __init__(self, spare_bytes: int) -> None:
        self.spare_bytes = spare_bytes
        self._free: dict[int, list[np.ndarray]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def array(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised float32 array of ``shape`` (a spare buffer if one fits)."""
        nbytes = 4 * int(np.prod(shape))
        with self._lock:
            spares = self._free.get(nbytes)
            buf = spares.pop() if spares else None
            if buf is not None:
                self._held -= nbytes
        if buf is None:
            buf = np.empty(nbytes // 4, dtype=np.float32)
        view = buf.reshape(shape)
        weakref.finalize(view, self._give_back, buf)
        return view

    def _give_back(self, buf: np.ndarray) -> None:
        with self._lock:
            if self._held + buf.nbytes <= self.spare_bytes:
                self._free.setdefault(int(buf.nbytes), []).append(buf)
                self._held += int(buf.nbytes)

    def clear(self) -> None:
        """Free every spare buffer."""
        with self._lock:
            self._free.clear()
            self._held = 0


class StreamedBase:
    """Attach the base recorded in ``store`` (by :func:`seal_base`) to ``module``, streaming its weights.

    Parameters
    ----------
    module:
        The model (adapters injected or not). Its base tensors may be on the ``meta``
        device: resident ones are loaded from the store, streamed ones are never
        allocated. Changed in place.
    store:
        The open sealed store holding the base.
    lookahead:
        Weights fetched ahead of the one in use; at most ``lookahead + 1`` streamed
        weights are resident at once.
    spare_bytes:
        Memory kept for reuse by later fetches once a weight is dropped (default 32 MiB;
        0: none). Counted on top of the resident weights.
    niceness:
        Lower the prefetch thread's priority by this much (see
        :class:`~fedshard.store.weight_stream.WeightStream`).
    codes:
        :attr:`Codes.MEMORY`: read every streamed weight's codes once, now, and keep them;
        :attr:`Codes.STORE`: read them from the store at every use.
    band_values:
        With codes in memory, the most values of a band of rows dequantised at once (one tile
        row at least; :data:`~fedshard.store.held_codes.BAND_VALUES`, 1 MiB of float32).

    Raises
    ------
    StoreError
        The store records no base.
    ShardError
        The module's tensors do not match the recorded base (name, shape), or a streamed
        weight requires grad.
    ShardIntegrityError
        A resident tensor fails its read checks (streamed ones too with
        :attr:`Codes.MEMORY`; with :attr:`Codes.STORE` they raise when fetched).
    """

    def __init__(
        self,
        module: nn.Module,
        store: SealedShardStore,
        *,
        lookahead: int = 2,
        spare_bytes: int = 32 << 20,
        niceness: int = 0,
        codes: Codes = Codes.MEMORY,
        band_values: int = BAND_VALUES,
    ) -> None:
        doc = store.get_meta(BASE_META)
        if not isinstance(doc, dict) or doc.get("version") != _META_VERSION:
            raise StoreError(f"store {store.location} records no frozen base (seal one with seal_base)")
        self.store = store
        self.plan = ShardPlan.from_json(doc["plan"])
        self.format = ColdFormat(doc["format"])
        self._specs = {t.name: t for t in self.plan.tensors}
        self.streamed: tuple[str, ...] = tuple(doc["streamed"])
        self.codes = Codes(codes)
        self._held: dict[str, HeldWeight] = {}
        self._band = BandBuffer(band_values)
        self._buffers = _Buffers(spare_bytes)
        self.stream = WeightStream(self._fetch, lookahead, niceness=niceness)
        slots = dict(_slots(module))
        for spec in self.plan.tensors:
            slot = slots.get(spec.name)
            if slot is None:
                raise ShardError(f"the stored base has tensor {spec.name!r}, which the module lacks")
            if tuple(slot.tensor.shape) != spec.shape:
                raise ShardError(
                    f"tensor {spec.name!r} of the module has shape {tuple(slot.tensor.shape)}, the base {spec.shape}"
                )
            if slot.tensor.requires_grad:
                raise ShardError(f"tensor {spec.name!r} requires grad; a stored base tensor must be frozen")
        streamed = set(self.streamed)
        for spec in self.plan.tensors:  # resident tensors first: a streamed Linear keeps its loaded bias
            slot = slots[spec.name]
            if spec.name not in streamed:
                values = torch.from_numpy(self._fetch(spec.name))
                if slot.is_param:
                    slot.owner._parameters[slot.attr] = nn.Parameter(values, requires_grad=False)
                else:
                    slot.owner._buffers[slot.attr] = values
        if self.codes is Codes.MEMORY:
            for name in self.streamed:
                spec = self._specs[name]
                tiles = [(s.rows, s.cols, s.shard_id) for s in ShardPlan([spec], self.plan.tile).shards]
                self._held[name] = HeldWeight(name, spec.view2d, self.format, tiles, store.cold_codes, self._band)
        for name in self.streamed:
            self._replace(module, slots[name], name)
        left = [n for n, s in _slots(module) if s.tensor.is_meta]
        if left:
            raise ShardError(f"tensor {left[0]!r} is on the meta device and not in the stored base ({len(left)} such)")
        self.resident_bytes = sum(s.nbytes for s in self.plan.shards if s.tensor not in streamed)
        self.streamed_bytes = sum(s.nbytes for s in self.plan.shards if s.tensor in streamed)
        self.held_bytes = sum(held.nbytes for held in self._held.values())
        """Bytes of cold codes held in memory (0 with :attr:`Codes.STORE`)."""

    def _fetch(self, name: str) -> np.ndarray:
        """One tensor of the base, assembled from its verified (dequantised) shards."""
        spec: TensorSpec = self._specs[name]
        full = self._buffers.array(spec.shape)
        view = full.reshape(spec.view2d)
        for shard in ShardPlan([spec], self.plan.tile).shards:
            view[shard.rows, shard.cols] = self.store.reread(shard.shard_id)
        return full

    def _replace(self, module: nn.Module, slot: _Slot, name: str) -> None:
        owner = slot.owner
        source: WeightSource = self._held.get(name) or _Fetched(name, self.stream)
        new: nn.Module
        if isinstance(owner, nn.Linear):
            new = StreamedLinear(owner, name, source)
        elif isinstance(owner, nn.Embedding):
            new = StreamedEmbedding(owner, name, source)
        else:  # pragma: no cover - seal_base streams only these two
            raise ShardError(f"cannot stream {name!r}: {type(owner).__name__} is not a Linear or an Embedding")
        for parent in module.modules():
            for child_name, child in parent.named_children():
                if child is owner:
                    setattr(parent, child_name, new)

    @property
    def stats(self) -> StreamStats:
        """The stream's counters (fetches, misses, wait and fetch time); with codes in memory
        the stream is not used (:attr:`held_stats`)."""
        return self.stream.stats

    @property
    def held_stats(self) -> HeldStats:
        """What the held codes' bands dequantised (:attr:`Codes.MEMORY`); reassignable, to count anew."""
        return self._band.stats

    @held_stats.setter
    def held_stats(self, stats: HeldStats) -> None:
        self._band.stats = stats

    @property
    def peak_resident(self) -> int:
        """Most streamed weights resident at once so far."""
        return self.stream.peak_resident

    def close(self) -> None:
        """Stop the prefetch thread and free the spare buffers (a later forward restarts it)."""
        self.stream.close()
        self._buffers.clear()
        self._band.release()
