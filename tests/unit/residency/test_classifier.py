"""Sensitivity classifier: config rules win, detectors mark leaky tensors personal, shards inherit."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from fedshard.config import ClassRule, ResidencyConfig
from fedshard.errors import ConfigError, ShardError
from fedshard.residency import Classification, SensitivityClassifier
from fedshard.sharding import ShardPlan

FIRST = "first layer: sees raw input features"
OUTPUT_BIAS = "output bias: leaks label distribution"
EMBEDDING = "embedding table: rows reveal which tokens occur"
LORA = "LoRA adapter: trained on local data"
FINE_TUNED = "fine-tuned: trainable while the base model is frozen, so fitted to local data"
NONE = "no detector matched"


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update ``B @ A``."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_A.T @ self.lora_B.T


class TinyTransformer(nn.Module):
    """Token classifier: embedding, one encoder layer, LoRA head; base frozen, norm2 and LoRA trainable."""

    def __init__(self, vocab: int = 40, dim: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=32, batch_first=True)
        self.head = LoRALinear(nn.Linear(dim, classes))
        for name, param in self.named_parameters():
            param.requires_grad_("lora_" in name or name.startswith("encoder.norm2."))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def _by_tensor(result: dict[str, Classification]) -> dict[str, Classification]:
    return {shard_id.split("#")[0]: c for shard_id, c in result.items()}


@pytest.mark.parametrize("with_model", [True, False])
def test_mlp_first_layer_and_output_bias_are_personal(with_model: bool) -> None:
    model = MLP()
    plan = ShardPlan.from_state_dict(model.state_dict())
    got = _by_tensor(SensitivityClassifier().classify(plan, model if with_model else None))
    assert got == {
        "fc1.weight": Classification("personal", FIRST),
        "fc1.bias": Classification("personal", FIRST),
        "fc2.weight": Classification("public", NONE),
        "fc2.bias": Classification("public", NONE),
        "out.weight": Classification("public", NONE),
        "out.bias": Classification("personal", OUTPUT_BIAS),
    }


def test_transformer_with_lora_and_frozen_base() -> None:
    model = TinyTransformer()
    model(torch.randint(0, 40, (2, 5)))  # it is a working model
    plan = ShardPlan.from_state_dict(model.state_dict())
    got = _by_tensor(SensitivityClassifier().classify(plan, model))
    assert got["embed.weight"] == Classification("personal", EMBEDDING)
    assert got["head.lora_A"] == Classification("personal", LORA)
    assert got["head.lora_B"] == Classification("personal", LORA)
    assert got["head.base.bias"] == Classification("personal", OUTPUT_BIAS)
    assert got["encoder.norm2.weight"] == Classification("personal", FINE_TUNED)
    assert got["encoder.norm2.bias"] == Classification("personal", FINE_TUNED)
    personal = {name for name, c in got.items() if c.shard_class == "personal"}
    assert personal == {
        "embed.weight",
        "head.lora_A",
        "head.lora_B",
        "head.base.bias",
        "encoder.norm2.weight",
        "encoder.norm2.bias",
    }
    # Frozen internals (attention, feed-forward, the head's base weight) are public.
    for name in ("encoder.self_attn.in_proj_weight", "encoder.linear1.weight", "head.base.weight"):
        assert got[name] == Classification("public", NONE)


def test_transformer_by_name_only() -> None:
    model = TinyTransformer()
    plan = ShardPlan.from_state_dict(model.state_dict())
    got = _by_tensor(SensitivityClassifier().classify(plan))
    assert got["embed.weight"] == Classification("personal", EMBEDDING)
    assert got["head.lora_A"].reason == LORA
    assert got["head.base.bias"] == Classification("personal", OUTPUT_BIAS)
    # Without the model nothing tells which parameters are frozen.
    assert got["encoder.norm2.weight"] == Classification("public", NONE)


def test_fully_trainable_model_has_no_fine_tuned_tensors() -> None:
    model = TinyTransformer()
    for param in model.parameters():
        param.requires_grad_(True)
    got = _by_tensor(SensitivityClassifier().classify(ShardPlan.from_state_dict(model.state_dict()), model))
    assert got["encoder.norm2.weight"] == Classification("public", NONE)
    assert FINE_TUNED not in {c.reason for c in got.values()}


def test_tiles_inherit_their_tensor_class() -> None:
    model = nn.Sequential(nn.Linear(10, 12), nn.ReLU(), nn.Linear(12, 2))
    plan = ShardPlan.from_state_dict(model.state_dict(), tile=(4, 4))
    got = SensitivityClassifier().classify(plan, model)
    assert list(got) == plan.shard_ids
    first = [sid for sid in got if sid.startswith("0.weight#")]
    assert len(first) == 9
    assert all(got[sid] == Classification("personal", FIRST) for sid in first)
    assert got["2.bias#r0c0"].reason == OUTPUT_BIAS


def test_config_rules_win_in_order() -> None:
    rules = [
        ClassRule(pattern="fc2.*", shard_class="genomic", reason="trained on variants"),
        ClassRule(pattern="fc*", shard_class="restricted"),
    ]
    model = MLP()
    got = _by_tensor(SensitivityClassifier(rules).classify(ShardPlan.from_state_dict(model.state_dict()), model))
    assert got["fc2.weight"] == Classification("genomic", "config rule 'fc2.*': trained on variants")
    assert got["fc1.weight"].shard_class == "restricted"
    assert got["fc1.weight"].reason == f"config rule 'fc*' (overrides {FIRST})"
    assert got["out.bias"] == Classification("personal", OUTPUT_BIAS)


def test_config_rule_marking_personal_needs_no_override_note() -> None:
    classifier = SensitivityClassifier([ClassRule(pattern="fc1.*", shard_class="personal")])
    model = MLP()
    got = _by_tensor(classifier.classify(ShardPlan.from_state_dict(model.state_dict()), model))
    assert got["fc1.weight"] == Classification("personal", "config rule 'fc1.*'")


def test_declassifying_a_leaky_tensor_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    classifier = SensitivityClassifier([ClassRule(pattern="*.lora_*", shard_class="public")])
    with caplog.at_level(logging.WARNING, logger="fedshard.residency._classifier"):
        got = classifier.classify_tensor("head.lora_A")
    assert got == Classification("public", f"config rule '*.lora_*' (overrides {LORA})")
    assert "head.lora_A" in caplog.text


def test_detectors_off_leaves_config_rules_and_default() -> None:
    classifier = SensitivityClassifier([ClassRule(pattern="out.*", shard_class="restricted")], detectors=False)
    model = MLP()
    got = _by_tensor(classifier.classify(ShardPlan.from_state_dict(model.state_dict()), model))
    assert got["fc1.weight"] == Classification("public", "no config rule matched (detectors off)")
    assert got["out.bias"].shard_class == "restricted"


def test_from_config() -> None:
    config = ResidencyConfig.model_validate({"classes": [{"pattern": "fc2.*", "class": "restricted"}]})
    classifier = SensitivityClassifier.from_config(config)
    assert classifier.classify_tensor("fc2.bias").shard_class == "restricted"
    assert classifier.detectors


def test_classify_tensor_without_context_uses_name_detectors() -> None:
    classifier = SensitivityClassifier()
    assert classifier.classify_tensor("tok_embeddings.weight") == Classification("personal", EMBEDDING)
    assert classifier.classify_tensor("blocks.0.adapter.down.weight").reason == "adapter: trained on local data"
    assert classifier.classify_tensor("blocks.0.attn.lora.B").reason == LORA
    assert classifier.classify_tensor("fc1.weight") == Classification("public", NONE)
    model = MLP()
    assert classifier.classify_tensor("fc1.weight", model=model).reason == FIRST
    plan = ShardPlan.from_state_dict(model.state_dict())
    assert classifier.classify_tensor("out.bias", plan=plan).reason == OUTPUT_BIAS


def test_weight_tied_to_embedding_is_an_embedding() -> None:
    class TiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(20, 8)
            self.mix = nn.Linear(8, 8)
            self.lm_head = nn.Linear(8, 20, bias=False)
            self.lm_head.weight = self.embed.weight

    model = TiedLM()
    got = _by_tensor(SensitivityClassifier().classify(ShardPlan.from_state_dict(model.state_dict()), model))
    assert got["lm_head.weight"] == Classification("personal", EMBEDDING)
    # the last Linear with a bias is mix: with no bias on the head, it is the output bias
    assert got["mix.bias"].reason == OUTPUT_BIAS


def test_first_layer_buffers_are_personal() -> None:
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2))
    got = _by_tensor(SensitivityClassifier().classify(ShardPlan.from_state_dict(model.state_dict()), model))
    # the running mean of the first layer is the mean of the raw inputs
    assert got["0.running_mean"] == Classification("personal", FIRST)
    assert got["1.weight"] == Classification("public", NONE)


def test_plan_of_another_model_is_refused() -> None:
    plan = ShardPlan.from_state_dict(MLP().state_dict())
    with pytest.raises(ShardError, match=r"'fc1\.weight' of the shard plan is not in the model"):
        SensitivityClassifier().classify(plan, TinyTransformer())


def test_bad_default_class() -> None:
    with pytest.raises(ConfigError, match="lowercase identifier"):
        SensitivityClassifier(default="Public")
