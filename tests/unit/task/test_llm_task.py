"""The LLM task (clients/tasks/llm): data splits, frozen base, LoRA adapters, Task protocol."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("peft")

import torch

from clients.tasks.llm import LlmTask
from clients.tasks.llm.data import CLASSES, dirichlet_partition, split_corpus
from clients.tasks.llm.model import AdapterScheme, evaluate_examples
from fedshard.task import Partition, Task, TrainSettings, build_initial_model, load_task


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llm-base")


@pytest.fixture(scope="module")
def tiny(cache: Path) -> LlmTask:
    # one pretraining epoch is enough for these tests (and keeps them to seconds)
    return LlmTask(size="tiny", cache_dir=str(cache), pretrain_epochs=1)


def test_splits_are_disjoint_deterministic_and_large_enough() -> None:
    a = split_corpus(vocab=4096, seq_len=32)
    b = split_corpus(vocab=4096, seq_len=32)
    assert np.array_equal(a.public.tokens, b.public.tokens) and np.array_equal(a.test.labels, b.test.labels)
    assert len(a.test) >= 2000
    rows = [{r.tobytes() for r in s.tokens} for s in (a.public, a.private, a.test)]
    # hashed token rows of distinct tweets rarely coincide; the splits share (almost) none
    assert len(rows[0] & rows[2]) < 20 and len(rows[1] & rows[2]) < 40
    other = split_corpus(vocab=4096, seq_len=32, data_seed=1)
    assert not np.array_equal(a.test.labels, other.test.labels)


def test_site_partition_is_deterministic_complete_and_label_skewed() -> None:
    labels = split_corpus(vocab=4096, seq_len=32).private.labels
    parts = dirichlet_partition(labels, sites=4, alpha=0.5, seed=3)
    again = dirichlet_partition(labels, sites=4, alpha=0.5, seed=3)
    assert all(np.array_equal(p, q) for p, q in zip(parts, again, strict=True))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    shares = np.array([np.bincount(labels[p], minlength=len(CLASSES)) / len(p) for p in parts])
    overall = np.bincount(labels, minlength=len(CLASSES)) / len(labels)
    # non-IID: some site's label mix is far from the overall mix
    assert np.abs(shares - overall).max() > 0.15
    iid = dirichlet_partition(labels, sites=4, alpha=1000.0, seed=3)
    iid_shares = np.array([np.bincount(labels[p], minlength=len(CLASSES)) / len(p) for p in iid])
    assert np.abs(iid_shares - overall).max() < 0.05


def test_adapters_are_the_only_trainable_tensors_and_named_lora(tiny: LlmTask) -> None:
    model = build_initial_model(tiny, seed=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_B" in n for n in trainable)  # FFA: B only
    assert {n.split(".")[2] for n in trainable} == {"qkv", "proj", "ff1", "ff2"}
    both = LlmTask(size="tiny", cache_dir=tiny.cache_dir, pretrain_epochs=1, scheme=AdapterScheme.FEDAVG)
    names = [n for n, p in build_initial_model(both, seed=0).named_parameters() if p.requires_grad]
    assert len(names) == 2 * len(trainable) and all("lora_" in n for n in names)


def test_base_is_cached_and_identical(tiny: LlmTask, cache: Path) -> None:
    a, b = tiny.base().state_dict(), tiny.base().state_dict()
    assert len(list(cache.glob("llm-base-*.safetensors"))) == 1
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the same seed builds the same adapters at every site
    m1, m2 = build_initial_model(tiny, seed=5), build_initial_model(tiny, seed=5)
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_train_changes_only_adapters_and_beats_the_frozen_base(tiny: LlmTask) -> None:
    model = build_initial_model(tiny, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # a near-IID twelfth of the private data (~2,000 tweets, seconds): a label-skewed site
    # alone would learn its own label mix and may well lose accuracy on the global test set
    iid = LlmTask(size="tiny", cache_dir=tiny.cache_dir, pretrain_epochs=1, dirichlet_alpha=1000.0)
    data = iid.load_data(Partition(index=0, count=12, seed=0))
    test = tiny.splits().test  # score on the whole test set: a slice is too noisy for a 0.5 pp margin
    base_acc = evaluate_examples(model, test)[1]
    assert base_acc == pytest.approx(evaluate_examples(tiny.base(), test)[1])  # B = 0: adapters are a no-op
    metrics = tiny.train(model, data, TrainSettings(epochs=2, batch_size=32, learning_rate=3e-3, seed=0))
    assert metrics.num_examples == data.num_train
    for name, p in model.named_parameters():
        if "lora_B" in name:
            assert not torch.equal(p, before[name]), name
        else:
            assert p.grad is None and not p.requires_grad and torch.equal(p, before[name]), name
    assert evaluate_examples(model, test)[1] > base_acc + 0.005
    assert tiny.evaluate(model, data).num_examples == data.num_test


def test_load_task_builds_it_from_config_options(cache: Path) -> None:
    task = load_task("clients.tasks.llm:task", {"size": "tiny", "cache_dir": str(cache), "pretrain_epochs": 1})
    assert isinstance(task, Task)
    data = [task.load_data(Partition(index=i, count=3, seed=1)) for i in range(3)]
    assert sum(d.num_test for d in data) == task.load_data(Partition(index=None, count=1, seed=1)).num_test
    with pytest.raises(Exception, match="size"):
        load_task("clients.tasks.llm:task", {"size": "huge"})
