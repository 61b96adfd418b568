"""Sensitivity classification: which shard class each gradient shard belongs to.

A shard inherits the class of its tensor. A tensor's class comes from, in order:

1. the config's ``classes`` rules (first matching fnmatch pattern wins), then
2. automatic detectors (unless turned off), which mark ``personal`` the tensors whose
   gradients are known to leak training data:

   * adapter / LoRA parameters (names containing ``lora_``, ``lora.`` or ``adapter``):
     they are trained on the local data only;
   * embedding tables: the rows that receive gradient are exactly the tokens that occur;
   * the first layer that sees raw inputs: its weight and bias gradients together
     reconstruct the input (``x = ∂L/∂W_i / ∂L/∂b_i``);
   * the output layer's bias: its gradient reveals the label distribution;
   * fine-tuned parameters: when part of the model is frozen, the trainable rest is
     fitted to local personal data;

3. otherwise the default class (``public``).

With a model, detectors use module types, registration order (the order modules are
assigned in ``__init__``, which is the forward order of nearly every model) and
``requires_grad``; without one they fall back to tensor names and the plan's shapes.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedshard.config.residency import ClassRule, ResidencyConfig, ShardClass
from fedshard.errors import ConfigError, ShardError
from fedshard.sharding.plan import ShardPlan

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Classification", "SensitivityClassifier"]

_log = logging.getLogger(__name__)
_CLASS_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

EMBEDDING = "embedding table: rows reveal which tokens occur"
FIRST_LAYER = "first layer: sees raw input features"
OUTPUT_BIAS = "output bias: leaks label distribution"
LORA = "LoRA adapter: trained on local data"
ADAPTER = "adapter: trained on local data"
FINE_TUNED = "fine-tuned: trainable while the base model is frozen, so fitted to local data"
NO_DETECTOR = "no detector matched"


@dataclass(frozen=True, slots=True)
class Classification:
    """The shard class of a tensor or shard and a human-readable reason for it."""

    shard_class: str
    reason: str


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the structural detectors found: tensor names by detector."""

    embeddings: frozenset[str] = frozenset()
    first_layer: frozenset[str] = frozenset()
    output_bias: str | None = None
    fine_tuned: frozenset[str] = frozenset()


def _module_of(name: str) -> str:
    return name.rpartition(".")[0]


def _adapter_reason(name: str) -> str | None:
    lowered = name.lower()
    if "lora_" in lowered or "lora." in lowered:
        return LORA
    if "adapter" in lowered:
        return ADAPTER
    return None


def _embedding_by_name(name: str) -> bool:
    return any("embed" in part.lower() for part in name.split("."))


def _facts_from_model(model: nn.Module) -> _Facts:
    from torch import nn

    embedding_ids: set[int] = set()
    first: set[str] = set()
    output_bias: str | None = None
    trainable: set[str] = set()
    any_frozen = False
    modules = [(name, module) for name, module in model.named_modules(remove_duplicate=False)]
    parameterised = [(n, m) for n, m in modules if next(m.parameters(recurse=False), None) is not None]
    # Parameters held by the root itself (class tokens, position tables) are not a layer
    # that sees the input, unless the root is the only module that has any.
    layers = [(n, m) for n, m in parameterised if n] or parameterised
    if layers:
        name, module = layers[0]
        first.update(n for n, _ in module.named_parameters(prefix=name, recurse=False))
        first.update(n for n, _ in module.named_buffers(prefix=name, recurse=False))
    for name, module in parameterised:
        prefix = f"{name}." if name else ""
        if isinstance(module, nn.Embedding | nn.EmbeddingBag):
            embedding_ids.add(id(module.weight))
        if isinstance(module, nn.Linear) and module.bias is not None:
            output_bias = f"{prefix}bias"
        for param_name, param in module.named_parameters(prefix=name, recurse=False):
            if param.requires_grad:
                trainable.add(param_name)
            else:
                any_frozen = True
    # A weight tied to an embedding table (a language model's output projection) is
    # the same tensor under another name: it leaks what the table leaks.
    embeddings = {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in embedding_ids}
    return _Facts(
        embeddings=frozenset(embeddings),
        first_layer=frozenset(first),
        output_bias=output_bias,
        fine_tuned=frozenset(trainable) if any_frozen else frozenset(),
    )


def _facts_from_names(plan: ShardPlan) -> _Facts:
    names = [t.name for t in plan.tensors]
    shapes = {t.name: t.shape for t in plan.tensors}
    embeddings = {n for n in names if _embedding_by_name(n)}
    first = {n for n in names if _module_of(n) == _module_of(names[0])} if names else set()
    output_bias = None
    for name in names:
        module = _module_of(name)
        weight = f"{module}.weight" if module else "weight"
        if name.rpartition(".")[2] == "bias" and len(shapes[name]) == 1 and len(shapes.get(weight, ())) == 2:
            output_bias = name
    return _Facts(embeddings=frozenset(embeddings), first_layer=frozenset(first), output_bias=output_bias)


class SensitivityClassifier:
    """Assign a shard class to every tensor (and so every shard) of a model.

    Parameters
    ----------
    rules:
        Config rules, tried in order; the first whose pattern matches a tensor name wins.
    detectors:
        Whether automatic detectors classify leaky tensors as ``personal``.
    default:
        Class of tensors that no rule and no detector matches.
    """

    def __init__(self, rules: Sequence[ClassRule] = (), detectors: bool = True, default: str = "public") -> None:
        if not _CLASS_RE.match(default):
            raise ConfigError(f"default shard class must be a lowercase identifier such as 'public', got {default!r}")
        self.rules: tuple[ClassRule, ...] = tuple(rules)
        self.detectors = detectors
        self.default = default

    @classmethod
    def from_config(cls, config: ResidencyConfig) -> SensitivityClassifier:
        """The classifier a federation's residency config describes."""
        return cls(config.classes, detectors=config.detectors)

    def classify(self, plan: ShardPlan, model: nn.Module | None = None) -> dict[str, Classification]:
        """Classify every shard of ``plan``; a shard inherits its tensor's class.

        Parameters
        ----------
        plan:
            The shard plan.
        model:
            The model the plan was built from; lets detectors use module types and
            ``requires_grad``. Without it they use names and shapes only.

        Returns
        -------
        dict
            ``{shard_id: Classification}`` in plan order.

        Raises
        ------
        ShardError
            If a tensor of the plan is not in ``model``'s ``state_dict`` (the wrong model
            would silently hide leaky tensors).
        """
        facts = self._facts(plan, model)
        by_tensor = {spec.name: self._classify(spec.name, facts) for spec in plan.tensors}
        return {shard.shard_id: by_tensor[shard.tensor] for shard in plan.shards}

    def classify_tensor(
        self, name: str, plan: ShardPlan | None = None, model: nn.Module | None = None
    ) -> Classification:
        """Classify one tensor by name.

        Parameters
        ----------
        name:
            Tensor name as in the ``state_dict`` (``fc1.weight``).
        plan, model:
            Context for the structural detectors (first layer, output bias, embeddings,
            fine-tuning). With neither, only config rules and the name detectors
            (adapters, ``embed``) apply.
        """
        if model is not None and plan is None:
            facts = _facts_from_model(model)
        elif plan is not None:
            facts = self._facts(plan, model)
        elif self.detectors and _embedding_by_name(name):
            facts = _Facts(embeddings=frozenset({name}))
        else:
            facts = _Facts()
        return self._classify(name, facts)

    # internals ------------------------------------------------------------------------
    def _facts(self, plan: ShardPlan, model: nn.Module | None) -> _Facts:
        if not self.detectors:
            return _Facts()
        if model is None:
            return _facts_from_names(plan)
        known = set(model.state_dict())
        missing = [t.name for t in plan.tensors if t.name not in known]
        if missing:
            raise ShardError(
                f"tensor {missing[0]!r} of the shard plan is not in the model; "
                "classify with the model the plan was built from"
            )
        return _facts_from_model(model)

    def _classify(self, name: str, facts: _Facts) -> Classification:
        detected = self._detect(name, facts)
        for rule in self.rules:
            if fnmatch.fnmatchcase(name, rule.pattern):
                reason = f"config rule {rule.pattern!r}" + (f": {rule.reason}" if rule.reason else "")
                if detected is not None and rule.shard_class != ShardClass.PERSONAL:
                    # A loud opt-out: the user declassified a tensor known to leak.
                    reason += f" (overrides {detected})"
                    _log.warning("residency: %s classified %s by %s", name, rule.shard_class, reason)
                return Classification(rule.shard_class, reason)
        if detected is not None:
            return Classification(ShardClass.PERSONAL.value, detected)
        return Classification(self.default, NO_DETECTOR if self.detectors else "no config rule matched (detectors off)")

    def _detect(self, name: str, facts: _Facts) -> str | None:
        if not self.detectors:
            return None
        adapter = _adapter_reason(name)
        if adapter is not None:
            return adapter
        checks: Mapping[str, bool] = {
            EMBEDDING: name in facts.embeddings,
            FIRST_LAYER: name in facts.first_layer,
            OUTPUT_BIAS: name == facts.output_bias,
            FINE_TUNED: name in facts.fine_tuned,
        }
        return next((reason for reason, hit in checks.items() if hit), None)
