"""The task plug-in: what a federation trains, on what data.

A task is any object with the four methods of :class:`Task`. Point a federation at
it with ``task.target: "package.module:object"``; if the object is a class or a
factory function it is called with ``task.options`` as keyword arguments.

A model's parameters that the built model marks frozen (``requires_grad=False``, e.g.
a pretrained base under LoRA adapters) are not federated: they are never released,
aggregated or saved with the model's shards (:func:`trained_state`); they must be the
same at every site, which the genesis version binds (:func:`frozen_state`).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fedshard.config.privacy import LayerPolicy
from fedshard.errors import TaskError

if TYPE_CHECKING:
    import torch

    from fedshard.privacy.mechanisms.dpsgd import RecordPrivacy

__all__ = [
    "Metrics",
    "Partition",
    "Task",
    "TaskData",
    "TrainSettings",
    "build_initial_model",
    "frozen_state",
    "load_task",
    "trained_state",
]

_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Partition:
    """Which slice of the task's data a site holds. ``index=None`` means all of it
    (used only for the centrally trained baseline)."""

    index: int | None
    count: int
    seed: int


@dataclass(frozen=True, slots=True)
class TaskData:
    """A site's local data, opaque to fedshard except for the counts."""

    train: Any
    test: Any
    num_train: int
    num_test: int


@dataclass(frozen=True, slots=True)
class TrainSettings:
    """Local training settings for one round."""

    epochs: int
    batch_size: int
    learning_rate: float
    seed: int
    privacy: RecordPrivacy | None = None
    """When set, train through ``privacy.make_private(model, optimizer, loader)`` (DP-SGD)."""


@dataclass(frozen=True, slots=True)
class Metrics:
    """Result of local training or evaluation.

    ``loss`` is finite and non-negative and ``accuracy`` (None: the task measures none) lies
    in [0, 1]: the coordinator leaves a site's reply outside these bounds out of the round's
    metrics, as it would a lying site's (:mod:`fedshard.coordinator._replies`).
    """

    num_examples: int
    loss: float
    accuracy: float | None = None


@runtime_checkable
class Task(Protocol):
    """What fedshard needs from a task."""

    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model (fedshard seeds torch before calling)."""
        ...

    def load_data(self, partition: Partition) -> TaskData:
        """This site's local data."""
        ...

    def train(self, model: torch.nn.Module, data: TaskData, settings: TrainSettings) -> Metrics:
        """Train ``model`` in place on ``data.train``."""
        ...

    def evaluate(self, model: torch.nn.Module, data: TaskData) -> Metrics:
        """Evaluate ``model`` on ``data.test``."""
        ...


def load_task(target: str, options: dict[str, Any] | None = None) -> Task:
    """Import ``"module:object"`` and return the task it names.

    Raises
    ------
    TaskError
        If the module or object cannot be found, or does not have the Task methods.
    """
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskError(f"cannot import task module {module_name!r} ({exc}); is it on PYTHONPATH?") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise TaskError(f"task module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type) or not isinstance(obj, Task):
        if not callable(obj):
            raise TaskError(f"{target} is neither a Task nor a factory of one")
        try:
            obj = obj(**(options or {}))
        except TypeError as exc:
            raise TaskError(f"cannot build task {target} with options {options or {}}: {exc}") from None
    elif options:
        raise TaskError(f"{target} is a ready-made task instance; it takes no task.options")
    if not isinstance(obj, Task):
        missing = [m for m in ("build_model", "load_data", "train", "evaluate") if not hasattr(obj, m)]
        raise TaskError(f"{target} does not implement the Task protocol (missing: {', '.join(missing)})")
    return obj


def build_initial_model(task: Task, seed: int, dp_layers: LayerPolicy = LayerPolicy.KEEP) -> torch.nn.Module:
    """The federation's initial model: every party seeds torch the same way, so every
    site (and every tool that needs the model's structure) builds the same one.

    ``dp_layers``: what to do with layers DP-SGD cannot train (see :class:`LayerPolicy`).
    """
    import torch

    with _BUILD_LOCK:  # torch's global generator: two threads seeding and drawing at once would mix
        torch.manual_seed(seed)
        model = task.build_model()
    dp_layers = LayerPolicy(dp_layers)
    if dp_layers is LayerPolicy.FIX:
        from fedshard.privacy.mechanisms.dpsgd import fix_model

        return fix_model(model)
    if dp_layers is LayerPolicy.CHECK:
        from fedshard.privacy.mechanisms.dpsgd import check_model

        check_model(model)
    return model


def frozen_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's frozen parameters (``requires_grad=False``) by ``state_dict`` name: a
    base the federation does not train (see the module docstring)."""
    frozen = {id(p) for p in model.parameters() if not p.requires_grad}
    return {name: t.detach() for name, t in model.state_dict(keep_vars=True).items() if id(t) in frozen}


def trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a federation trains and aggregates: the ``state_dict`` without the
    frozen parameters (buffers included; the shard plan keeps their floating-point ones)."""
    frozen = frozen_state(model)
    return {name: t.detach() for name, t in model.state_dict(keep_vars=True).items() if name not in frozen}
