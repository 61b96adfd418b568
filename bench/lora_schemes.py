"""Which way to aggregate LoRA adapters: FedAvg of A and B, or FFA-LoRA?

A plain-torch simulation of FedAvg (no fedshard: no zones, no shards, no DP) over the
LLM task's sites (``clients/tasks/llm``): the vendor's pretrained base, frozen; LoRA
on every qkv, proj, ff1 and ff2; ``--sites`` label-skewed Dirichlet(``--alpha``)
private splits; one shared test set (5,586 tweets). Per seed (LoRA initialisation,
site partition and shuffling all follow it) it trains

* ``fedavg``: A and B both train locally and are averaged separately, weighted by
  examples (what a federation does with any tensor; mean(B)·mean(A) ≠ mean(B·A));
* ``ffa``: FFA-LoRA (arXiv 2403.12313): A stays at its shared random initialisation,
  only B trains and is averaged, so the average of the sites' B·A is exact and half
  the adapter tensors are released;
* ``central``: LoRA (A and B) on the pooled private data, the same number of epochs
  as rounds × local epochs (the same number of passes over each example);

and scores the frozen base (no fine-tuning) once. Gaps are paired per seed: mean ±
standard error (std of the per-seed differences / √seeds).

    .venv/bin/python bench/lora_schemes.py [--quick] [--json] [--seeds N] [--rounds R] [--size S]

``--json``'s last line holds every figure: accuracies (mean, se), ``*_vs_central_pp``
and ``*_vs_central_se_pp``, ``central_vs_base_pp``, ``test_predictions``, parameter counts
and timings.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from clients.tasks.llm import LlmTask
from clients.tasks.llm.data import dirichlet_partition
from clients.tasks.llm.model import AdapterScheme, add_lora, evaluate_examples, fit

SCHEMES = (AdapterScheme.FEDAVG, AdapterScheme.FFA)


def trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The tensors a site trains (and would release)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def averaged_model(
    task: LlmTask, base: torch.nn.Module, scheme: AdapterScheme, train: Any, seed: int, lr: float, args: Any
) -> torch.nn.Module:
    """``args.rounds`` rounds of FedAvg of the adapters of ``scheme`` over ``args.sites`` label-skewed
    Dirichlet(``args.alpha``) parts of ``train``: every site starts each round from the average and
    trains ``args.local_epochs`` with a fresh Adam at ``lr``; the average is weighted by examples."""
    torch.manual_seed(seed)
    model = add_lora(copy.deepcopy(base), task.rank, task.lora_alpha, scheme)
    params = trainable(model)
    parts = dirichlet_partition(train.labels, args.sites, args.alpha, seed)
    sizes = [len(p) for p in parts]
    state = {n: p.detach().clone() for n, p in params.items()}
    for rnd in range(args.rounds):
        total = {n: torch.zeros_like(t) for n, t in state.items()}
        for site, index in enumerate(parts):
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(state[n])
            fit(model, train.take(index), args.local_epochs, args.batch, lr, seed * 1000 + rnd * 10 + site)
            for n, p in params.items():
                total[n] += p.detach() * sizes[site]
        state = {n: t / sum(sizes) for n, t in total.items()}
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state[n])
    return model


def federated(task: LlmTask, base: torch.nn.Module, scheme: AdapterScheme, seed: int, args: Any) -> float:
    """Test accuracy of ``args.rounds`` rounds of FedAvg of the adapters of ``scheme``."""
    splits = task.splits()
    return evaluate_examples(averaged_model(task, base, scheme, splits.private, seed, args.lr, args), splits.test)[1]


def central(task: LlmTask, base: torch.nn.Module, seed: int, args: Any) -> float:
    """Test accuracy of LoRA (A and B) trained on the pooled private data."""
    splits = task.splits()
    torch.manual_seed(seed)
    model = add_lora(copy.deepcopy(base), task.rank, task.lora_alpha, AdapterScheme.FEDAVG)
    fit(model, splits.private, args.rounds * args.local_epochs, args.batch, args.lr, seed)
    return evaluate_examples(model, splits.test)[1]


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (0 for one value)."""
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny model, 3 seeds, 2 rounds (about 4 minutes on 2 cores)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object last")
    parser.add_argument("--size", default=None, help="model size: tiny, small (default) or large")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=None, help="default 4 (quick: 2)")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet label skew of the sites")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--cache-dir", default="~/.cache/fedshard/llm")
    args = parser.parse_args()
    args.size = args.size or ("tiny" if args.quick else "small")
    args.rounds = args.rounds or (2 if args.quick else 4)

    task = LlmTask(size=args.size, cache_dir=args.cache_dir)
    started = time.perf_counter()
    base = task.base()
    base_s = time.perf_counter() - started
    test = task.splits().test
    base_acc = evaluate_examples(base, test)[1]
    counts = {"base": sum(p.numel() for p in base.parameters())}
    for scheme in SCHEMES:
        counts[f"adapter_{scheme}"] = sum(
            p.numel() for p in trainable(add_lora(copy.deepcopy(base), task.rank, task.lora_alpha, scheme)).values()
        )
    print(
        f"size {args.size}: base {counts['base']:,} parameters (frozen), adapters {counts['adapter_fedavg']:,} "
        f"(fedavg) / {counts['adapter_ffa']:,} (ffa); base ready in {base_s:.1f} s; frozen base accuracy {base_acc:.4f}"
    )

    acc: dict[str, list[float]] = {"central": [], **{str(s): [] for s in SCHEMES}}
    seconds: dict[str, list[float]] = {k: [] for k in acc}
    for seed in range(args.seeds):
        for name in acc:
            t0 = time.perf_counter()
            if name == "central":
                value = central(task, base, seed, args)
            else:
                value = federated(task, base, AdapterScheme(name), seed, args)
            seconds[name].append(time.perf_counter() - t0)
            acc[name].append(value)
            print(f"seed {seed} {name:8s} accuracy {value:.4f} ({seconds[name][-1]:.0f} s)", flush=True)

    figures: dict[str, Any] = {
        "size": args.size,
        "seeds": args.seeds,
        "rounds": args.rounds,
        "local_epochs": args.local_epochs,
        "sites": args.sites,
        "dirichlet_alpha": args.alpha,
        "lr": args.lr,
        "batch": args.batch,
        "test_predictions": len(test),
        "parameters": counts,
        "base_accuracy": base_acc,
        "base_ready_s": round(base_s, 1),
    }
    print(f"\n{'run':10s} {'accuracy':>16s} {'vs central (pp)':>18s} {'s/run':>7s}")
    for name, values in acc.items():
        m, se = mean_se(values)
        gm, gse = mean_se([100 * (a - c) for a, c in zip(values, acc["central"], strict=True)])
        figures[f"{name}_accuracy"] = {"mean": m, "se": se, "values": values}
        figures[f"{name}_s"] = round(statistics.fmean(seconds[name]), 1)
        if name != "central":
            figures[f"{name}_vs_central_pp"], figures[f"{name}_vs_central_se_pp"] = gm, gse
        print(f"{name:10s} {m:10.4f} ± {se:.4f} {gm:+10.2f} ± {gse:.2f} {figures[f'{name}_s']:7.0f}")
    cm, cse = mean_se([100 * (a - base_acc) for a in acc["central"]])
    figures["central_vs_base_pp"], figures["central_vs_base_se_pp"] = cm, cse
    fm, fse = mean_se([100 * (a - b) for a, b in zip(acc["ffa"], acc["fedavg"], strict=True)])
    figures["ffa_vs_fedavg_pp"], figures["ffa_vs_fedavg_se_pp"] = fm, fse
    print(f"{'base':10s} {base_acc:10.4f} (frozen, no fine-tuning); central LoRA gains {cm:+.2f} ± {cse:.2f} pp")
    print(f"ffa - fedavg: {fm:+.2f} ± {fse:.2f} pp")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
