"""The model of a Hugging Face sequence-classification task: the folder's pretrained model with a
new classifier head, frozen, under LoRA adapters injected by ``peft``.

What trains, and so what the federation releases and aggregates: the LoRA matrices of the
``targets`` layers (``all-linear``: every linear layer but the head) and the new head, which
PEFT keeps as a "module to save" (``classifier.modules_to_save.default``). The pretrained
weights and the head's initial copy stay frozen: they never leave a site, and with
``store.base`` set the site seals and streams them like any frozen base. Tensor names are
PEFT's own, so the trained tensors are exactly what ``PeftModel.save_pretrained`` writes
(:mod:`fedshard.tasks.hf.adapter`).

``scheme``: ``standard`` trains A and B (the federation averages each: the mean of the
products B·A is not the product of the means); ``ffa`` keeps A at its shared random start
and trains B only (FFA-LoRA, arXiv 2403.12313: averaging B averages B·A exactly, half the
bytes). The model is built under the federation's seed (:func:`fedshard.task.build_initial_model`),
so every party draws the same head and the same A.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from fedshard.errors import TaskError
from fedshard.tasks.hf.folder import ModelFolder, quiet_transformers

if TYPE_CHECKING:
    from torch import nn

__all__ = ["LoraSettings", "Scheme", "build_classifier"]


class Scheme(StrEnum):
    """Which LoRA matrices train (see the module docstring)."""

    STANDARD = "standard"
    FFA = "ffa"


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """LoRA adapters: rank r, scaling numerator (the update is ``alpha / r · B A``), dropout,
    the layers they adapt (module names, or ``all-linear``) and the scheme."""

    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    targets: str | tuple[str, ...] = "all-linear"
    scheme: Scheme = Scheme.FFA

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise TaskError(f"task.options.rank must be >= 1, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise TaskError(f"task.options.lora_dropout must lie in [0, 1), got {self.dropout}")


def build_classifier(folder: ModelFolder, labels: Sequence[str], lora: LoraSettings) -> nn.Module:
    """The folder's model with a ``len(labels)``-class head, frozen, under LoRA adapters (a
    ``peft.PeftModel``); draws the head and the adapters from torch's global generator."""
    quiet_transformers()
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(folder.config)
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {name: i for i, name in enumerate(labels)}
    config.pad_token_id = folder.tokenizer.pad_token_id
    config.problem_type = "single_label_classification"
    try:
        base = AutoModelForSequenceClassification.from_pretrained(folder.path, config=config, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise TaskError(
            f"task.options.model_dir {folder.path}: no sequence classifier can be built from it: {first}"
        ) from None
    targets = lora.targets if isinstance(lora.targets, str) else list(lora.targets)
    adapters = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
    )
    try:
        model = get_peft_model(base, adapters)
    except ValueError as exc:  # e.g. a target module the model does not have
        raise TaskError(f"task.options.targets {lora.targets}: {str(exc).splitlines()[0]}") from None
    if lora.scheme is Scheme.FFA:
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.requires_grad_(False)
    return model
