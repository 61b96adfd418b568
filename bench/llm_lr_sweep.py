"""Pick the LLM task's learning rates on validation data, federated and central alike.

``bench/llm_finetune.py`` compares federated LoRA with the same LoRA trained centrally on
the test set; the learning rate each uses is chosen here, on data neither is scored on.
**Validation split**: the private examples *after* the ``--private-examples`` the sites
and the central model train on (the private split is one random shuffle, so they are a
sample of the same distribution), ``--validation-examples`` of them; disjoint from the
training pool and from the test set.

Per learning rate and seed (the LoRA initialisation, the sites' Dirichlet partition and
the shuffling follow the seed) it trains, in plain torch (no zones, no DP: the
federation's arithmetic, which with FFA-LoRA is exact, and nothing else):

* **federated**: ``--rounds`` rounds over ``--sites`` label-skewed Dirichlet(``--alpha``)
  sites; each round every site starts from the average, trains ``--local-epochs`` with a
  fresh Adam (as the task's ``train`` does in a federation), and the new average of
  ``lora_B`` is weighted by examples;
* **central**: the same LoRA on the pooled training examples, ``rounds × local_epochs``
  epochs, one Adam;

and scores both on the validation split (and on the test set: shown, never used to
pick). Each method's learning rate is the one with the best mean validation accuracy;
``bench/llm_finetune.py --lr F --central-lr C`` then measures the gap on the test set.
Defaults: ``configs/demo-llm.yaml``'s task (``small``, FFA r=8, 6 sites, Dirichlet(1.0),
8,000 private examples), batch 64, 3 rounds × 1 epoch.

    nice -n 19 .venv/bin/python bench/llm_lr_sweep.py [--quick] [--json] [--seeds N] [--lrs 1e-3,2e-3,...]

Full mode (3 seeds × 5 learning rates × 2 methods at ``small``): about 25 minutes on a quiet
2-core machine. ``--quick``: the tiny model, one seed, two rates, one round, 2,000 examples
(``--smoke``, the test suite's: 300 examples, 200 validation examples).

``--json`` prints one JSON object last: ``fed_lr``, ``central_lr``,
``fed_validation_accuracy``, ``central_validation_accuracy`` (at the chosen rates),
``validation_examples``, ``test_gap_pp`` and ``test_gap_se_pp`` (federated at its pick − central
at its pick on the test set, paired by seed: shown, never used to pick), and per rate
``validation`` (``{lr: {fed, central}}``, means).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c
from _dp_runs import mean_se

SECTION = "llm_lr_sweep"
DEMO = c.REPO / "configs" / "demo-llm.yaml"


def demo_options() -> dict[str, Any]:
    """The task options of configs/demo-llm.yaml."""
    from fedshard.config.loader import load_federation

    return dict(load_federation(DEMO).task.options)


def split(task: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """(training pool, validation split) of the private split."""
    import numpy as np

    private = task.splits().private
    end = args.private_examples + args.validation_examples
    if end > len(private):
        raise SystemExit(f"--private-examples + --validation-examples = {end} > the {len(private)} private examples")
    return private.take(np.arange(args.private_examples)), private.take(np.arange(args.private_examples, end))


def federated(
    task: Any, base: Any, train: Any, scored: tuple[Any, Any], seed: int, lr: float, args: argparse.Namespace
) -> tuple[float, float]:
    """(validation, test) accuracy of FFA-LoRA averaged over ``args.sites`` sites for ``args.rounds`` rounds
    (``bench/lora_schemes.py``'s federation)."""
    from lora_schemes import averaged_model

    from clients.tasks.llm.model import evaluate_examples

    model = averaged_model(task, base, task.scheme, train, seed, lr, args)
    return evaluate_examples(model, scored[0])[1], evaluate_examples(model, scored[1])[1]


def central(
    task: Any, base: Any, train: Any, scored: tuple[Any, Any], seed: int, lr: float, args: argparse.Namespace
) -> tuple[float, float]:
    """(validation, test) accuracy of the same LoRA trained on the pooled training examples."""
    import torch

    from clients.tasks.llm.model import add_lora, evaluate_examples, fit

    torch.manual_seed(seed)
    model = add_lora(copy.deepcopy(base), task.rank, task.lora_alpha, task.scheme)
    fit(model, train, args.rounds * args.local_epochs, args.batch, lr, seed)
    return evaluate_examples(model, scored[0])[1], evaluate_examples(model, scored[1])[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3; --quick 1)")
    parser.add_argument("--lrs", default=None, help="Adam learning rates (default 1e-3,2e-3,3e-3,5e-3,1e-2)")
    parser.add_argument("--size", default=None, help="model size (default: the demo's; --quick tiny)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; --quick 1)")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--alpha", type=float, default=None, help="Dirichlet label skew (default: the demo's)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--private-examples", type=int, default=None, help="training pool (default: the demo's)")
    parser.add_argument("--validation-examples", type=int, default=5586, help="validation split (default 5586)")
    parser.add_argument("--cache-dir", type=Path, default=c.REPO / "runs" / "llm-base", help="pretrained bases")
    args = parser.parse_args(argv)
    demo = demo_options()
    args.seeds = args.seeds or (1 if args.quick else 3)
    lrs = args.lrs or ("1e-3,3e-3" if args.quick else "1e-3,2e-3,3e-3,5e-3,1e-2")
    args.lr_values = [float(x) for x in lrs.split(",")]
    args.size = args.size or ("tiny" if args.quick else demo["size"])
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.alpha = args.alpha if args.alpha is not None else float(demo["dirichlet_alpha"])
    if args.private_examples is None:
        args.private_examples = 300 if args.smoke else 2000 if args.quick else int(demo["private_examples"])
    if args.quick:
        args.validation_examples = min(args.validation_examples, 200 if args.smoke else 2000)
    return args


Scores = dict[tuple[str, float], list[float]]


def sweep(task: Any, base: Any, train: Any, val: Any, args: argparse.Namespace) -> tuple[Scores, Scores]:
    """Validation and test accuracies by (method, learning rate), one per seed."""
    acc: Scores = {}
    test: Scores = {}
    t0 = time.perf_counter()
    for lr in args.lr_values:
        for seed in range(args.seeds):
            for name, method in (("fed", federated), ("central", central)):
                value, scored = method(task, base, train, (val, task.splits().test), seed, lr, args)
                acc.setdefault((name, lr), []).append(value)
                test.setdefault((name, lr), []).append(scored)
                print(
                    f"[{time.perf_counter() - t0:6.0f}s] lr {lr:g} seed {seed} {name:<7} validation {value:.4f}"
                    f"  test {scored:.4f}",
                    flush=True,
                )
    return acc, test


def main(argv: list[str] | None = None) -> int:
    """Sweep, pick, publish (see the module docstring)."""
    import torch

    from clients.tasks.llm import LlmTask

    args = parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    demo = demo_options()
    task = LlmTask(size=args.size, rank=demo["rank"], scheme=demo["scheme"], cache_dir=str(args.cache_dir))
    base = task.base()
    train, val = split(task, args)
    t0 = time.perf_counter()
    acc, test = sweep(task, base, train, val, args)
    means = {key: mean_se(values) for key, values in acc.items()}
    best = {name: max(args.lr_values, key=lambda lr: means[(name, lr)][0]) for name in ("fed", "central")}
    rows = [
        [
            f"{lr:g}" + "".join(f" ({n} pick)" for n in ("fed", "central") if best[n] == lr),
            *(f"{100 * means[(n, lr)][0]:.2f} ± {100 * means[(n, lr)][1]:.2f} %" for n in ("fed", "central")),
            f"{100 * (means[('fed', lr)][0] - means[('central', lr)][0]):+.2f} pp",
            " / ".join(f"{100 * statistics.fmean(test[(n, lr)]):.2f} %" for n in ("fed", "central")),
        ]
        for lr in args.lr_values
    ]
    gap = 100 * (means[("fed", best["fed"])][0] - means[("central", best["central"])][0])
    test_gap = mean_se(
        [100 * (f - c) for f, c in zip(test[("fed", best["fed"])], test[("central", best["central"])], strict=True)]
    )
    headline = {
        "fed_lr": best["fed"],
        "central_lr": best["central"],
        "fed_validation_accuracy": round(means[("fed", best["fed"])][0], 4),
        "central_validation_accuracy": round(means[("central", best["central"])][0], 4),
        "validation_examples": len(val),
        "test_gap_pp": round(test_gap[0], 4),
        "test_gap_se_pp": round(test_gap[1], 4),
        "validation": {
            f"{lr:g}": {n: round(means[(n, lr)][0], 4) for n in ("fed", "central")} for lr in args.lr_values
        },
    }
    notes = [
        f"- `{args.size}` base, FFA-LoRA r={task.rank}, {args.sites} sites Dirichlet({args.alpha:g}), "
        f"{args.private_examples:,} training examples, {len(val):,} validation examples (private, never trained "
        f"on, disjoint from the test set), {args.rounds} round(s) × {args.local_epochs} local epoch(s), batch "
        f"{args.batch}; central {args.rounds * args.local_epochs} epoch(s); {args.seeds} seed(s); plain torch "
        "(the federation's FFA arithmetic, no zones, no DP)",
        f"- wall time {time.perf_counter() - t0:.0f} s",
    ]
    interpretation = (
        f"On validation data the federation does best at lr {best['fed']:g} and the central LoRA at "
        f"{best['central']:g}; at those rates the federation is {gap:+.2f} pp from the central model on validation, "
        f"and {test_gap[0]:+.2f} ± {test_gap[1]:.2f} pp on the test set ({len(task.splits().test):,} predictions; "
        "this plain-torch replica of the federation, which `bench/llm_finetune.py` measures in the product with "
        "these rates)."
    )
    c.publish(
        args,
        SECTION,
        "LLM task learning rates chosen on validation data (issue 15)",
        f"{args.seeds} seed(s) × {len(args.lr_values)} learning rates × (federated, central)",
        None,
        notes=notes,
        headers=["Adam lr", "federated (validation)", "central (validation)", "fed − central", "test: fed / central"],
        rows=rows,
        interpretation=interpretation,
        headline=headline,
        console_title="LLM learning rates on validation",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
