"""The LLM task's model: the synthetic transformer's blocks with a classification head,
a centrally pretrained and cached base, and LoRA adapters injected by ``peft``.

The blocks are :class:`clients.tasks.large_transformer.Block` (pre-norm, fused QKV,
causal attention, 4× MLP). Padding sits at the end of each row, so causal attention
never lets a real token see a pad; the head reads the mean of the real positions.

``peft`` and torch are imported inside the functions that need them: ``peft`` costs
about 2.5 s of import (it pulls in ``transformers``), paid only by a process that
actually builds the model.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clients.tasks.large_transformer import TransformerConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    from clients.tasks.llm.data import Examples

__all__ = [
    "LORA_TARGETS",
    "SIZES",
    "AdapterScheme",
    "PretrainSettings",
    "add_lora",
    "build_classifier",
    "evaluate_examples",
    "fit",
    "load_or_pretrain_base",
]

SIZES: dict[str, TransformerConfig] = {
    # a test-sized model: trains in seconds
    "tiny": TransformerConfig(vocab=4096, d_model=64, heads=2, layers=2, ffn=256, max_len=32),
    # the accuracy benches' size: a few million parameters, minutes on 2 cores
    "small": TransformerConfig(vocab=16384, d_model=128, heads=4, layers=4, ffn=512, max_len=32),
    # large_transformer's 118 M configuration (sequence length cut to the task's 32)
    "large": TransformerConfig(max_len=32),
}

LORA_TARGETS: tuple[str, ...] = ("qkv", "proj", "ff1", "ff2")
"""Every attention (fused qkv, output proj) and MLP projection of every block."""


class AdapterScheme(StrEnum):
    """How the adapters train and are averaged.

    ``FEDAVG``: both LoRA matrices A and B train and are averaged separately (the mean
    of the B·A products is *not* the product of the means). ``FFA``: A stays at its
    shared random initialisation and only B trains (FFA-LoRA, arXiv 2403.12313), so
    averaging B averages B·A exactly and half as many tensors are released.
    """

    FEDAVG = "fedavg"
    FFA = "ffa"


@dataclass(frozen=True, slots=True)
class PretrainSettings:
    """How the vendor pretrains the base (full-parameter training on the public split)."""

    epochs: int = 3
    batch_size: int = 64
    learning_rate: float = 1e-3
    seed: int = 0


def build_classifier(cfg: TransformerConfig, classes: int) -> nn.Module:
    """A freshly initialised classifier (uses torch's global RNG; seed it first)."""
    import torch
    from torch import nn

    from clients.tasks.large_transformer import Block

    class SequenceClassifier(nn.Module):
        """Token ids ``(batch, time)``, 0 = pad, to class logits ``(batch, classes)``."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
            self.norm = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, classes)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            mask = (tokens != 0).unsqueeze(-1).to(self.pos.weight.dtype)
            x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            pooled = (self.norm(x) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return self.head(pooled)

    return SequenceClassifier()


def fit(
    model: nn.Module,
    examples: Examples,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    make_private: Callable[[Any, Any, Any], tuple[Any, Any, Any]] | None = None,
) -> tuple[float, int]:
    """Adam on the trainable parameters (:func:`fedshard.tasks.loop.fit`); returns (mean loss, examples seen)."""
    from fedshard.tasks.loop import fit as fit_loop

    return fit_loop(model, _tensors(examples), _logits, epochs, batch_size, learning_rate, seed, make_private)


def evaluate_examples(model: nn.Module, examples: Examples, batch_size: int = 512) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on ``examples``."""
    from fedshard.tasks.loop import score

    return score(model, _tensors(examples), _logits, batch_size)


def _tensors(examples: Examples) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    return torch.from_numpy(np.ascontiguousarray(examples.tokens)), torch.from_numpy(examples.labels)


def _logits(net: Any, inputs: Any) -> torch.Tensor:
    (tokens,) = inputs
    return net(tokens)  # type: ignore[no-any-return]


def base_key(cfg: TransformerConfig, classes: int, data: dict[str, Any], settings: PretrainSettings) -> str:
    """The cache key of a base: everything that determines its weights."""
    spec = {"version": 1, "cfg": asdict(cfg), "classes": classes, "data": data, "pretrain": asdict(settings)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


def load_or_pretrain_base(
    cfg: TransformerConfig,
    classes: int,
    public: Examples,
    data_spec: dict[str, Any],
    settings: PretrainSettings,
    cache_dir: str | os.PathLike[str],
) -> nn.Module:
    """The vendor's pretrained base, from ``cache_dir`` or pretrained now (then cached).

    Pretraining is seeded and runs on one thread, so a missing cache rebuilds the same
    base; the cache makes every site and the coordinator load identical weights. The
    file is written to a temporary name and renamed, so a crash leaves no half file.
    """
    import torch
    from safetensors.torch import load_file, save_file

    path = Path(cache_dir) / f"llm-base-{base_key(cfg, classes, data_spec, settings)}.safetensors"
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        model = build_classifier(cfg, classes)
    if path.exists():
        model.load_state_dict(load_file(str(path)))
        return model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fit(model, public, settings.epochs, settings.batch_size, settings.learning_rate, settings.seed)
    finally:
        torch.set_num_threads(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    os.replace(tmp, path)
    return model


def add_lora(model: nn.Module, rank: int, alpha: int, scheme: AdapterScheme, dropout: float = 0.0) -> nn.Module:
    """Freeze ``model`` and inject LoRA adapters (``peft``) on :data:`LORA_TARGETS`.

    Adapter tensors are named ``….lora_A.default.weight`` / ``….lora_B.default.weight``;
    under ``FFA`` the A tensors are frozen too. B starts at zero, so the adapted model
    computes exactly what the base does until it trains.
    """
    from peft import LoraConfig, inject_adapter_in_model

    for p in model.parameters():
        p.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(LORA_TARGETS))
    model = inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_B" in name or ("lora_A" in name and scheme is AdapterScheme.FEDAVG))
    return model
