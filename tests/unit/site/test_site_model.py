"""The model a site holds: built once, torch's generator untouched, views that write through,
and a module that looks as built after a task trained it (hooks, attributes, grads, modes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedshard.errors import ShardError
from fedshard.site._model import HeldModel


def _build() -> nn.Module:
    torch.manual_seed(5)  # what build_initial_model does: it must not leak out of the build
    return nn.Sequential(nn.Linear(6, 40), nn.BatchNorm1d(40), nn.Linear(40, 3))


def test_builds_once_and_leaves_the_global_generator_as_it_was() -> None:
    calls = []
    held = HeldModel(lambda: calls.append(1) or _build(), (16, 16))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    module = held.module()
    assert torch.equal(torch.rand(3), expected)
    assert held.module() is module and held.plan is held.plan
    held.shards()
    held.split()
    held.tidy()
    assert calls == [1] and held.builds == 1 and held.initial
    # the values are the seeded ones, the same at every site
    assert torch.equal(module[0].weight, _build()[0].weight)


def test_shard_views_write_through_to_the_module() -> None:
    held = HeldModel(_build, (16, 16))
    weight = held.module()[0].weight  # (40, 6): three row tiles of 16
    views = held.shards()
    assert len(views) == len(held.plan) and list(views) == held.plan.shard_ids
    views["0.weight#r1c0"] = np.full((16, 6), 7.0, dtype=np.float32)
    assert torch.all(weight[16:32] == 7.0) and not torch.any(weight[:16] == 7.0)
    copy = held.split()
    copy["0.weight#r0c0"][:] = -1.0  # a copy: the module does not change
    assert not torch.any(weight[:16] == -1.0)
    with pytest.raises(TypeError):
        del views["0.weight#r0c0"]


def test_tidy_undoes_what_training_added_besides_the_parameters() -> None:
    held = HeldModel(_build, (16, 16))
    module = held.module()
    bn = module[1]
    built_batches = int(bn.num_batches_tracked)
    handle_count = len(module[0]._forward_hooks)
    # what a task (and Opacus inside it) leaves behind
    module[0].register_forward_hook(lambda *a: None)
    module[2].register_full_backward_hook(lambda *a: None)
    module.autograd_grad_sample_hooks = []
    module.train()
    module(torch.randn(8, 6)).sum().backward()
    module[0].weight.grad_sample = torch.zeros(1)
    module[2].weight.requires_grad_(False)
    module.eval()
    assert int(bn.num_batches_tracked) == built_batches + 1
    with torch.no_grad():
        module[0].weight.fill_(3.0)  # parameters are the store's business, not tidy's
    held.tidy()
    assert len(module[0]._forward_hooks) == handle_count and not module[2]._backward_hooks
    assert not hasattr(module, "autograd_grad_sample_hooks") and not hasattr(module[0].weight, "grad_sample")
    assert all(p.grad is None and p.requires_grad for p in module.parameters())
    assert module.training and bn.training  # as built
    assert int(bn.num_batches_tracked) == built_batches
    assert torch.all(module[0].weight == 3.0)


def test_tied_weights_are_applied_once() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

    held = HeldModel(Tied, (16, 16))
    assert held.aliases() == frozenset({"a.weight#r0c0"})


def test_a_replaced_parameter_of_another_shape_is_refused() -> None:
    held = HeldModel(_build, (16, 16))
    module = held.module()
    module[0].weight = nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(ShardError, match=r"0\.weight"):
        held.tensors()
    held.discard()
    assert held.module() is not module and held.builds == 2


def test_a_non_contiguous_parameter_is_made_contiguous_with_the_same_values() -> None:
    values = torch.arange(24, dtype=torch.float32).reshape(4, 6)

    def build() -> nn.Module:
        module = nn.Linear(4, 6, bias=False)
        module.weight = nn.Parameter(values.t())  # a transposed view: not contiguous
        return module

    held = HeldModel(build, (16, 16))
    assert not build().weight.is_contiguous()
    tensors = held.tensors()
    assert tensors["weight"].flags.c_contiguous
    assert np.array_equal(tensors["weight"], values.t().numpy())
    held.shards()["weight#r0c0"] = np.zeros((6, 4), dtype=np.float32)
    assert torch.all(held.module().weight == 0)


def _with_frozen_base(seed: int = 5) -> nn.Module:
    """A pretrained-base stand-in: the first layer frozen (as under LoRA adapters), the rest trained."""
    module = _build()
    with torch.no_grad():
        module[0].weight.add_(seed)  # another "vendor" base for another seed
    for p in module[0].parameters():
        p.requires_grad_(False)
    return module


def test_frozen_parameters_are_not_federated() -> None:
    held = HeldModel(_with_frozen_base, (16, 16))
    tensors = {t.name for t in held.plan.tensors}
    assert "0.weight" not in tensors and "0.bias" not in tensors  # never split, released, aggregated or saved
    assert {"1.weight", "1.bias", "1.running_mean", "1.running_var", "2.weight", "2.bias"} == tensors
    assert set(held.tensors()) == tensors
    assert set(held.frozen_digests()) == {"frozen:0.weight", "frozen:0.bias"}


def test_the_frozen_base_is_not_copied_to_restore_it() -> None:
    held = HeldModel(_with_frozen_base, (16, 16))
    held.module()
    assert held._pristine is not None
    assert not {"0.weight", "0.bias"} & set(held._pristine.others)  # frozen: nothing to put back
    held.tidy()
    assert not held.module()[0].weight.requires_grad  # still frozen after tidy


def test_the_frozen_digests_tell_bases_apart() -> None:
    same = HeldModel(_with_frozen_base, (16, 16)).frozen_digests()
    assert HeldModel(_with_frozen_base, (16, 16)).frozen_digests() == same
    assert (
        HeldModel(lambda: _with_frozen_base(seed=6), (16, 16)).frozen_digests()["frozen:0.weight"]
        != (same["frozen:0.weight"])
    )
    assert HeldModel(_build, (16, 16)).frozen_digests() == {}  # nothing frozen: the genesis is as before
