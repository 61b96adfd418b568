"""The model a site holds for the life of its process.

A site builds its model once (the task's ``build_model``, seeded from the federation
seed inside a forked RNG, so torch's global generator is left as it was) and keeps it.
Every message refills the module's tensors from the site's store (the store decrypts
its shards straight into them), applies aggregates in place through
:class:`ShardViews`, and saves from the same tensors; the one copy a train message
makes is the pre-training snapshot its update is computed from (:meth:`HeldModel.split`).

Between messages :meth:`HeldModel.tidy` puts back what a task may have changed besides
the parameters (hooks and attributes added while training, e.g. by Opacus, gradients,
train/eval modes, integer buffers), so each message sees the module as it was built,
with the store's values: what a freshly built model would be, without building one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshard.errors import ShardError
from fedshard.sharding import ShardPlan
from fedshard.task import frozen_state, trained_state

if TYPE_CHECKING:
    import torch

    from fedshard.site.base import SealedBase

__all__ = ["HeldModel", "ShardViews"]

_SIMPLE = (bool, int, float, str, type(None))


class ShardViews(MutableMapping[str, np.ndarray]):
    """Shard id → writable 2-D view of the module tensor it is a tile of.

    Reading gives the view (no copy); assigning copies the values into the module.
    """

    def __init__(self, plan: ShardPlan, tensors: Mapping[str, np.ndarray]) -> None:
        self._plan = plan
        self._tensors = tensors

    def __getitem__(self, shard_id: str) -> np.ndarray:
        spec = self._plan.shard(shard_id)
        tensor = self._tensors[spec.tensor]
        return tensor.reshape(_view2d(tensor.shape))[spec.rows, spec.cols]  # a view: tensor is contiguous

    def __setitem__(self, shard_id: str, value: np.ndarray) -> None:
        self[shard_id][...] = value

    def __delitem__(self, shard_id: str) -> None:
        raise TypeError("a model's shards cannot be deleted")

    def __iter__(self) -> Iterator[str]:
        return iter(self._plan.shard_ids)

    def __len__(self) -> int:
        return len(self._plan)


def _view2d(shape: tuple[int, ...]) -> tuple[int, int]:
    if not shape:
        return (1, 1)
    return (shape[0], math.prod(shape[1:]))  # Python ints: np.prod costs microseconds per call


@dataclass
class _Pristine:
    """The module as built, apart from the plan's tensors (see :meth:`HeldModel.tidy`)."""

    others: dict[str, torch.Tensor]  # tensors outside the plan (integer buffers), as built
    attrs: list[tuple[Any, dict[str, Any], frozenset[str]]]  # module: simple attributes, all attribute names
    hooks: list[tuple[dict[Any, Any], frozenset[Any]]]  # every hook table of every submodule, its keys
    grads: list[tuple[torch.nn.Parameter, bool]]  # requires_grad of every parameter


class HeldModel:
    """A site's model, built on first use and kept.

    Parameters
    ----------
    build:
        Builds the federation's initial model (same values at every site).
    tile:
        The federation's shard tile.
    base:
        Where the model's frozen base is sealed and streamed from (``store.base``); None:
        the base stays in the module as built.
    """

    def __init__(
        self, build: Callable[[], torch.nn.Module], tile: tuple[int, int], base: SealedBase | None = None
    ) -> None:
        self._build = build
        self._tile = tile
        self._base = base
        self._frozen_digests: dict[str, str] = {}
        self._module: torch.nn.Module | None = None
        self._plan: ShardPlan | None = None
        self._pristine: _Pristine | None = None
        self._frozen: frozenset[str] = frozenset()  # frozen parameters (not federated), by name
        self.builds = 0  # models built by this object
        self.initial = False  # the module holds the values it was built with

    @property
    def built(self) -> bool:
        """Whether the module exists in this process."""
        return self._module is not None

    @property
    def nbytes(self) -> int:
        """Memory the built module's tensors hold (parameters and buffers, a frozen base
        included; tensors without storage, on the meta device, count nothing); 0 unbuilt."""
        if self._module is None:
            return 0
        tensors = [*self._module.parameters(), *self._module.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")

    def module(self) -> torch.nn.Module:
        """The module (built on first use)."""
        if self._module is None:
            self._make()
        assert self._module is not None
        return self._module

    @property
    def plan(self) -> ShardPlan:
        """The module's shard plan."""
        if self._plan is None:
            self._make()
        assert self._plan is not None
        return self._plan

    def _make(self) -> None:
        import torch

        with torch.random.fork_rng(devices=[]):  # the seed the build sets stays inside it
            module = self._build()
        self.builds += 1
        self.initial = not any(t.is_meta for t in module.state_dict().values())
        if not self.initial:  # a lazily built model: storage now, values from the store
            module.to_empty(device="cpu")
        for tensor in module.state_dict(keep_vars=True).values():
            if not tensor.is_contiguous():  # shards are written into the tensors' memory
                tensor.data = tensor.data.contiguous()
        plan = ShardPlan.from_state_dict(trained_state(module), self._tile)
        self._frozen = frozenset(frozen_state(module))
        self._frozen_digests = _digests(module, self._frozen)
        if self._base is not None and self._frozen:
            self._base.attach(module, self._frozen_digests)  # the base's fp32 weights leave the module
        self._module, self._plan = module, plan
        self._pristine = _snapshot(module, plan, self._frozen)

    def tensors(self) -> dict[str, np.ndarray]:
        """The plan's tensors as NumPy arrays sharing the module's memory, by name."""
        state = self.module().state_dict(keep_vars=True)
        out: dict[str, np.ndarray] = {}
        for spec in self.plan.tensors:
            tensor = state.get(spec.name)
            array = tensor.detach().numpy() if tensor is not None else None
            if array is None or tuple(array.shape) != spec.shape or not array.flags.c_contiguous:
                raise ShardError(f"tensor {spec.name!r} of the model no longer matches its shard plan")
            out[spec.name] = array
        return out

    def root(self) -> str:
        """The Merkle root of the module's values: every shard, and the frozen base (a site
        built on another base starts from another genesis version)."""
        from fedshard.integrity import merkle_root, shard_digest

        return merkle_root({**{sid: shard_digest(a) for sid, a in self.shards().items()}, **self.frozen_digests()})

    def frozen_digests(self) -> dict[str, str]:
        """``"frozen:<name>"`` → BLAKE3 digest of each frozen parameter (a base the federation
        does not train; see :func:`~fedshard.task.frozen_state`): what the genesis version binds."""
        self.module()
        return dict(self._frozen_digests)

    def shards(self) -> ShardViews:
        """Every shard as a writable view of the module's memory."""
        return ShardViews(self.plan, self.tensors())

    def split(self) -> dict[str, np.ndarray]:
        """A contiguous copy of every shard (the pre-training values a train message keeps)."""
        return self.plan.split(self.tensors())

    def aliases(self) -> frozenset[str]:
        """Shards of tensors that share memory with a later tensor of the plan (tied weights).

        Loading writes such a tensor's values twice and the last write wins; applying an
        aggregate to both would add it twice, so only the last alias is applied.
        """
        tensors = self.tensors()
        last: dict[int, str] = {}
        for name, array in tensors.items():
            last[array.__array_interface__["data"][0]] = name
        shadowed = {n for n, a in tensors.items() if last[a.__array_interface__["data"][0]] != n}
        return frozenset(s.shard_id for s in self.plan.shards if s.tensor in shadowed)

    def tidy(self) -> None:
        """Put back everything but the plan's tensors as it was when the module was built."""
        if self._module is None or self._pristine is None:
            return
        import torch

        p = self._pristine
        state = self._module.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, value in p.others.items():
                state[name].copy_(value)
        for table, keys in p.hooks:
            for key in [k for k in table if k not in keys]:
                del table[key]
        for obj, simple, names in p.attrs:
            for name in [n for n in vars(obj) if n not in names]:
                delattr(obj, name)
            vars(obj).update(simple)
        for param, requires_grad in p.grads:
            param.grad = None
            param.requires_grad_(requires_grad)

    def discard(self) -> None:
        """Forget the module (a task left it in a state :meth:`tidy` cannot undo); the next use builds it."""
        self._module, self._plan, self._pristine = None, None, None
        self.initial = False
        if self._base is not None:
            self._base.close()

    def close(self) -> None:
        """Release what the module holds outside memory (the streamed base's store and thread)."""
        if self._base is not None:
            self._base.close()


def _digests(module: torch.nn.Module, frozen: frozenset[str]) -> dict[str, str]:
    from fedshard.integrity import shard_digest

    state = module.state_dict()
    return {f"frozen:{name}": shard_digest(state[name].numpy()) for name in sorted(frozen)}


def _snapshot(module: torch.nn.Module, plan: ShardPlan, frozen: frozenset[str]) -> _Pristine:
    planned = {t.name for t in plan.tensors} | frozen  # frozen parameters never change: no copy
    others = {n: t.detach().clone() for n, t in module.state_dict().items() if n not in planned}
    attrs: list[tuple[Any, dict[str, Any], frozenset[str]]] = []
    hooks: list[tuple[dict[Any, Any], frozenset[Any]]] = []
    for sub in module.modules():
        own = vars(sub)
        attrs.append((sub, {k: v for k, v in own.items() if isinstance(v, _SIMPLE)}, frozenset(own)))
        hooks += [(v, frozenset(v)) for k, v in own.items() if "hooks" in k and isinstance(v, dict)]
    grads = []
    for param in module.parameters():
        attrs.append((param, {}, frozenset(vars(param))))
        grads.append((param, param.requires_grad))
    return _Pristine(others, attrs, hooks, grads)
