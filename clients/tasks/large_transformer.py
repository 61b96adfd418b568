"""A synthetic large model (≥ 100 M parameters) for storage benchmarks and later work.

A small pre-norm transformer stack: token and position embeddings, ``layers`` blocks
(LayerNorm, fused QKV attention, output projection, LayerNorm, 4× MLP), a final
LayerNorm, and an output head tied to the token embedding. The default
:class:`TransformerConfig` has 118.1 M parameters (472.3 MB in float32).

Built lazily: :func:`build_model` makes the module on the ``meta`` device (no memory),
and :func:`init_tensors` yields each tensor's deterministic initial values one at a
time, from the seed and the tensor's name alone, so a model can be written into a
shard store (:func:`write_to_store`) or filled in place (:func:`materialise`) without
ever holding two copies.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from fedshard.sharding.plan import DEFAULT_TILE, ShardPlan
from fedshard.store.model_io import ModelRecord, plan_of, write_tensors
from fedshard.store.sealed_store import SealedShardStore

__all__ = [
    "LargeTransformer",
    "TransformerConfig",
    "build_model",
    "init_tensors",
    "materialise",
    "num_parameters",
    "shard_plan",
    "write_to_store",
]


@dataclass(frozen=True, slots=True)
class TransformerConfig:
    """Sizes of the synthetic transformer (defaults: 118.1 M parameters)."""

    vocab: int = 16384
    d_model: int = 1024
    heads: int = 16
    layers: int = 8
    ffn: int = 4096
    max_len: int = 512


class Block(nn.Module):
    """One pre-norm transformer block."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff1 = nn.Linear(cfg.d_model, cfg.ffn)
        self.ff2 = nn.Linear(cfg.ffn, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention then MLP, each with a residual connection."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.ln2(x))))


class LargeTransformer(nn.Module):
    """The synthetic model; ``forward`` maps token ids ``(batch, time)`` to logits."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # _weight skips nn.Embedding's random init: weights come from init_tensors (and the init
        # would import torch._dynamo, seconds of start-up, just to fill a meta tensor)
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model, _weight=torch.empty(cfg.vocab, cfg.d_model))
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model, _weight=torch.empty(cfg.max_len, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary (output head tied to the token embedding)."""
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.T


def build_model(cfg: TransformerConfig | None = None) -> LargeTransformer:
    """The model on the ``meta`` device: shapes only, no memory (see :func:`materialise`)."""
    with torch.device("meta"):
        return LargeTransformer(cfg or TransformerConfig())


def num_parameters(cfg: TransformerConfig | None = None) -> int:
    """Number of parameters of the model of ``cfg``."""
    return sum(p.numel() for p in build_model(cfg).parameters())


def _init(name: str, shape: tuple[int, ...], seed: int, layers: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if ".ln" in name or name.startswith("norm."):
        return torch.ones(shape)
    std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("proj.weight", "ff2.weight")) else 0.02
    return torch.randn(shape, generator=gen) * std


def init_tensors(cfg: TransformerConfig | None = None, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, initial values)`` of every tensor in ``state_dict`` order, one at a time.

    Deterministic: the values depend only on ``seed`` and the tensor's name.
    """
    cfg = cfg or TransformerConfig()
    for name, tensor in build_model(cfg).state_dict().items():
        yield name, _init(name, tuple(tensor.shape), seed, cfg.layers)


def materialise(cfg: TransformerConfig | None = None, seed: int = 0) -> LargeTransformer:
    """The model with real (CPU) weights from :func:`init_tensors`."""
    model = build_model(cfg)
    model.to_empty(device="cpu")
    targets = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, values in init_tensors(cfg, seed):
            targets[name].copy_(values)
    return model


def shard_plan(cfg: TransformerConfig | None = None, tile: tuple[int, int] = DEFAULT_TILE) -> ShardPlan:
    """The model's shard plan (from shapes alone)."""
    state = build_model(cfg).state_dict()
    return plan_of(((name, tuple(t.shape), "<f4") for name, t in state.items()), tile)


def write_to_store(
    store: SealedShardStore, cfg: TransformerConfig | None = None, seed: int = 0, tile: tuple[int, int] = DEFAULT_TILE
) -> ModelRecord:
    """Write the model's initial weights into ``store`` by its shard plan, in one commit.

    One tensor is generated at a time; the store records the plan, the genesis model
    version and the Merkle root.
    """
    return write_tensors(store, shard_plan(cfg, tile), init_tensors(cfg, seed))
