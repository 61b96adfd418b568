"""Layer-by-layer loading with background prefetch and a bounded look-ahead.

:class:`PrefetchLoader` yields a model's layers in forward order, each as
``{tensor name: array}``. While the caller uses layer *i*, a background thread
fetches, decrypts, dequantises and verifies the shards of layers *i+1 … i+k* and
joins them into tensors (``k`` = ``lookahead``).

Memory bound: a layer is *resident* from the moment the thread starts fetching it
until the caller asks for the next layer after it. At most ``lookahead + 1`` layers
are resident at any time (the one in use and ``lookahead`` ahead); the thread waits
for a free slot before it starts on another layer. ``lookahead = 0`` loads each layer
only when asked, in the caller's thread (no prefetch). The bound assumes the caller
drops a layer's arrays once it moves on (e.g. copies them into the model).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np

from fedshard.errors import StoreError
from fedshard.sharding.plan import ShardPlan, TensorSpec

__all__ = ["Layer", "PrefetchLoader", "layers_of"]

Fetch = Callable[[str], np.ndarray]  # shard id -> verified values


@dataclass(frozen=True, slots=True)
class Layer:
    """A group of tensors loaded together (a module of the model), in forward order."""

    name: str
    tensors: tuple[str, ...]


def _layer_key(tensor: str) -> str:
    """``blocks.3.attn.qkv.weight`` → ``blocks.3``; ``embed.weight`` → ``embed``."""
    parts = tensor.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0] if len(parts) > 1 else tensor


def layers_of(plan: ShardPlan, key: Callable[[str], str] = _layer_key) -> list[Layer]:
    """Group the plan's tensors into layers, in plan (``state_dict``, i.e. forward) order.

    By default a layer is a top-level module, or an item of a numbered container
    (``blocks.3``). Tensors of one layer that are not adjacent in the plan stay apart,
    so the order is never changed.
    """
    layers: list[tuple[str, list[str]]] = []
    for spec in plan.tensors:
        name = key(spec.name)
        if layers and layers[-1][0] == name:
            layers[-1][1].append(spec.name)
        else:
            layers.append((name, [spec.name]))
    return [Layer(name, tuple(tensors)) for name, tensors in layers]


_END = object()


class PrefetchLoader:
    """Iterate over ``(layer, {tensor name: array})`` in order, prefetching ahead (see the module docstring).

    Parameters
    ----------
    fetch:
        Returns the verified values of one shard (e.g. ``store.get``); called from the
        background thread when ``lookahead > 0``.
    plan:
        The model's shard plan.
    layers:
        Layers in forward order (default :func:`layers_of`).
    lookahead:
        Layers fetched ahead of the one in use (0: none).
    out:
        Where to assemble each tensor (e.g. views of a module's parameters): the shards
        are written straight into it, with no intermediate copy. Default: new arrays.
    workers:
        Shards of a layer fetched concurrently (threads; hashing and file reads release
        the GIL). The layers' order and the memory bound do not change.
    """

    def __init__(
        self,
        fetch: Fetch,
        plan: ShardPlan,
        layers: Sequence[Layer] | None = None,
        lookahead: int = 2,
        *,
        out: Mapping[str, np.ndarray] | None = None,
        workers: int = 1,
    ) -> None:
        if lookahead < 0:
            raise StoreError(f"lookahead must be 0 or more, got {lookahead}")
        if workers < 1:
            raise StoreError(f"workers must be 1 or more, got {workers}")
        self._fetch = fetch
        self._plan = plan
        self._specs = {t.name: t for t in plan.tensors}
        self._out = out
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self.layers = list(layers) if layers is not None else layers_of(plan)
        self.lookahead = lookahead
        self._lock = threading.Lock()
        self.resident = 0  # layers resident now
        self.peak_resident = 0  # most layers resident at once
        self.resident_bytes = 0
        self.peak_bytes = 0
        self.fetch_order: list[str] = []  # layer names, in the order fetching started

    # materialising a layer ------------------------------------------------------------
    def _tensor(self, spec: TensorSpec) -> np.ndarray:
        if self._out is None:
            full = np.empty(spec.shape, dtype=spec.dtype)
        else:
            full = self._out[spec.name]
            if full.shape != spec.shape or not full.flags.c_contiguous:
                raise StoreError(f"the destination of {spec.name!r} is not a C-contiguous array of shape {spec.shape}")
        view = full.reshape(spec.view2d)  # a view: full is contiguous
        shards = ShardPlan([spec], self._plan.tile).shards  # the same shard ids as in the full plan
        fetched = (
            self._pool.map(self._fetch, [s.shard_id for s in shards])
            if self._pool
            else map(self._fetch, [s.shard_id for s in shards])
        )
        for shard, piece in zip(shards, fetched, strict=True):
            if piece.shape != shard.shape:
                raise StoreError(f"shard {shard.shard_id!r} has shape {piece.shape}, the plan says {shard.shape}")
            view[shard.rows, shard.cols] = piece
        return full

    def _materialise(self, layer: Layer) -> dict[str, np.ndarray]:
        with self._lock:
            self.resident += 1
            self.peak_resident = max(self.peak_resident, self.resident)
            self.fetch_order.append(layer.name)
        tensors = {name: self._tensor(self._specs[name]) for name in layer.tensors}
        nbytes = sum(int(a.nbytes) for a in tensors.values())
        with self._lock:
            self.resident_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
        return tensors

    def _release(self, tensors: dict[str, np.ndarray]) -> None:
        with self._lock:
            self.resident -= 1
            self.resident_bytes -= sum(int(a.nbytes) for a in tensors.values())

    # iteration -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[Layer, dict[str, np.ndarray]]]:
        self._pool = ThreadPoolExecutor(self.workers, "fedshard-fetch") if self.workers > 1 else None
        try:
            if self.lookahead == 0:
                for layer in self.layers:
                    tensors = self._materialise(layer)
                    yield layer, tensors
                    self._release(tensors)
                return
            yield from self._prefetching()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    def _prefetching(self) -> Iterator[tuple[Layer, dict[str, np.ndarray]]]:
        slots = threading.Semaphore(self.lookahead + 1)
        ready: queue.Queue[object] = queue.Queue()
        stop = threading.Event()

        def produce() -> None:
            try:
                for layer in self.layers:
                    slots.acquire()
                    if stop.is_set():
                        return
                    ready.put((layer, self._materialise(layer)))
            except BaseException as exc:  # handed to the caller's thread
                ready.put(exc)
                return
            ready.put(_END)

        thread = threading.Thread(target=produce, name="fedshard-prefetch", daemon=True)
        thread.start()
        previous: dict[str, np.ndarray] | None = None
        try:
            while True:
                if previous is not None:  # the caller asked for the next layer: the last one is done
                    self._release(previous)
                    previous = None
                    slots.release()
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                layer, tensors = cast(tuple[Layer, dict[str, np.ndarray]], item)
                previous = tensors
                yield layer, tensors
        finally:
            stop.set()
            slots.release()  # wake the thread if it waits for a slot
            thread.join()
            while not ready.empty():  # layers fetched ahead that nobody will use
                leftover = ready.get_nowait()
                if isinstance(leftover, tuple):
                    self._release(leftover[1])
            if previous is not None:
                self._release(previous)
