"""The large-model task's DP gap, measured the way ``bench/dp_accuracy.py`` measures its own.

``bench/llm_finetune.py`` reports the LLM task's DP gap at the *non-private* federation's
learning rate. Here the DP federation gets its own, chosen on validation data only:

1. **Choosing** (validation data): for every learning rate of ``--lrs`` and every tuning seed
   (``100, 101, …``: other LoRA initialisations and Dirichlet partitions than the test seeds), a
   full ``simulate`` federation of ``configs/demo-llm.yaml`` (all six sites in the EU, one
   averaged model; ``store.base: int8``) with record-level DP-SGD at ε = ``--epsilon`` per site
   (δ = 1e-5, σ calibrated by each site), scored on ``--validation-examples`` private examples
   that follow the training pool (never trained on; the task's ``validation_examples``, the
   test set not even loaded). The rate with the best mean validation accuracy is the pick.
2. **Measuring** (test set): per test seed (``0, 1, …``), the DP federation at its pick and the
   central LoRA on the pooled training data at its own validation pick (``--central-lr``,
   2e-3: ``bench/llm_lr_sweep.py``), both scored on the whole test set; the gap is their paired
   difference per seed, mean ± standard error (std / √seeds). Every site's ε spent is checked
   against its budget.

    .venv/bin/python bench/llm_dp.py [--quick] [--json] [--seeds N] [--tune-seeds N] [--lrs 1e-3,2e-3,5e-3]

Full mode (``small`` model, 3 rounds, 8,000 private examples, 3 rates × 3 tuning seeds, then
3 test seeds): about 30 minutes on a quiet 2-core machine. ``--quick``: the tiny model, one
round, 2,000 examples, two rates, one seed each. ``--smoke`` (the test suite's): the same on 300
examples, 100 validation examples and a 2 % test set.

``--json`` prints ``dp_lr`` (the pick), ``dp_vs_central_pp`` and ``dp_vs_central_se_pp`` (DP
federated − central on the test set, paired by seed), ``validation_accuracy`` (per rate),
``central_validation_accuracy``, ``test_predictions``, ``seeds`` and ``budget_respected``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c
import llm_finetune as llm
from _dp_runs import mean_se, pp

SECTION = "llm_dp"
TUNE_SEED0 = 100


def config(args: argparse.Namespace, seed: int, lr: float, validation: bool) -> Any:
    """The demo federation (pooled in the EU) with DP at ``args.epsilon``, Adam rate ``lr``, scored on
    the validation examples when ``validation``."""
    run_args = argparse.Namespace(**{**vars(args), "lr": lr})
    cfg = llm.accuracy_config(run_args, seed, args.epsilon, pooled=True)
    if not validation:
        return cfg
    task = cfg.task.model_copy(
        update={"options": {**cfg.task.options, "validation_examples": args.validation_examples}}
    )
    return cfg.model_copy(update={"task": task})


def dp_run(args: argparse.Namespace, seed: int, lr: float, validation: bool) -> tuple[float, float]:
    """(accuracy, the largest ε any site spent) of one DP federation."""
    run = llm.simulate_run("dp", seed, config(args, seed, lr, validation), central=False)
    return run.accuracy, max(site["epsilon_spent"] for site in run.summary["sites"])


def central_run(args: argparse.Namespace, seed: int, validation: bool) -> float:
    """The central LoRA on the pooled training data at ``args.central_lr``, scored like the DP runs."""
    return llm.central_accuracy(config(args, seed, args.central_lr, validation), args.central_lr)


def choose(args: argparse.Namespace, log: Any) -> tuple[float, dict[float, list[float]], list[float], float]:
    """Validation accuracy per rate and tuning seed; the central reference's; the pick; the largest ε spent."""
    seeds = range(TUNE_SEED0, TUNE_SEED0 + args.tune_seeds)
    scores: dict[float, list[float]] = {}
    spent = 0.0
    for seed in seeds:
        for lr in args.lr_values:
            acc, eps = dp_run(args, seed, lr, validation=True)
            scores.setdefault(lr, []).append(acc)
            spent = max(spent, eps)
            log(f"validation seed {seed} DP lr {lr:g}: {acc:.4f} (ε spent ≤ {eps:.3f})")
    central = []
    for seed in seeds:
        central.append(central_run(args, seed, validation=True))
        log(f"validation seed {seed} central lr {args.central_lr:g}: {central[-1]:.4f}")
    pick = max(args.lr_values, key=lambda lr: statistics.fmean(scores[lr]))
    return pick, scores, central, spent


def measure(args: argparse.Namespace, lr: float, log: Any) -> tuple[list[float], list[float], float]:
    """Test accuracy of the DP federation at ``lr`` and of the central LoRA, per test seed; the largest ε spent."""
    dp, central, spent = [], [], 0.0
    for seed in range(args.seeds):
        acc, eps = dp_run(args, seed, lr, validation=False)
        dp.append(acc)
        spent = max(spent, eps)
        central.append(central_run(args, seed, validation=False))
        log(f"test seed {seed}: DP lr {lr:g} {acc:.4f} (ε spent ≤ {eps:.3f}), central {central[-1]:.4f}")
    return dp, central, spent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--seeds", type=int, default=None, help="test seeds 0..N-1 (default 3; --quick 1)")
    parser.add_argument("--tune-seeds", type=int, default=None, help="tuning seeds from 100 (default 3; --quick 1)")
    parser.add_argument("--lrs", default=None, help="DP Adam learning rates to choose from (default 1e-3,2e-3,5e-3)")
    parser.add_argument("--epsilon", type=float, default=3.0, help="ε per site (default 3)")
    parser.add_argument("--central-lr", type=float, default=2e-3, help="the central LoRA's rate (its validation pick)")
    parser.add_argument("--validation-examples", type=int, default=None, help="default 5586 (--quick 500)")
    parser.add_argument("--dp-clip", type=float, default=1.0, help="DP-SGD clipping bound (default 1.0)")
    parser.add_argument("--cache-dir", type=Path, default=c.REPO / "runs" / "llm-base", help="pretrained bases")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 3)
    args.tune_seeds = args.tune_seeds or (1 if args.quick else 3)
    args.lr_values = [float(x) for x in (args.lrs or ("1e-3,5e-3" if args.quick else "1e-3,2e-3,5e-3")).split(",")]
    args.validation_examples = args.validation_examples or (100 if args.smoke else 500 if args.quick else 5586)
    args.size = "tiny" if args.quick else "small"
    args.rounds = 1 if args.quick else 3
    args.private_examples = 300 if args.smoke else 2000 if args.quick else 8000
    args.test_fraction = 0.02 if args.smoke else None  # --smoke: every code path, on a few hundred examples
    args.local_epochs, args.batch = 1, 64
    return args


def main(argv: list[str] | None = None) -> int:
    """Choose on validation data, measure on the test set, publish (see the module docstring)."""
    args = parse_args(argv)
    llm.quiet()
    t0 = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f}s] {line}", flush=True)

    pick, scores, central_val, spent_val = choose(args, log)
    dp, central, spent_test = measure(args, pick, log)
    gap = mean_se([100 * (d - cr) for d, cr in zip(dp, central, strict=True)])
    spent = max(spent_val, spent_test)
    test_predictions = args.seeds * len(llm_test_set(args))
    central_v = mean_se(central_val)
    rows = [
        [
            f"DP federated, Adam lr {lr:g}" + (" (pick)" if lr == pick else ""),
            f"{100 * mean_se(scores[lr])[0]:.2f} ± {100 * mean_se(scores[lr])[1]:.2f}",
            pp(*mean_se([100 * (a - cr) for a, cr in zip(scores[lr], central_val, strict=True)])),
        ]
        for lr in args.lr_values
    ]
    rows.append(
        [f"central LoRA, Adam lr {args.central_lr:g}", f"{100 * central_v[0]:.2f} ± {100 * central_v[1]:.2f}", "0"]
    )
    rows.append(
        [
            f"**test set**: DP federated at lr {pick:g} − central, paired by seed ({args.seeds} seeds)",
            f"{100 * statistics.fmean(dp):.2f} vs {100 * statistics.fmean(central):.2f}",
            pp(*gap),
        ]
    )
    headline = {
        "dp_lr": pick,
        "dp_vs_central_pp": gap[0],
        "dp_vs_central_se_pp": gap[1],
        "validation_accuracy": {f"{lr:g}": statistics.fmean(v) for lr, v in scores.items()},
        "central_validation_accuracy": central_v[0],
        "test_predictions": test_predictions,
        "seeds": args.seeds,
        "budget_respected": spent <= args.epsilon,
    }
    c.publish(
        args,
        SECTION,
        f"Large-model task: DP gap at ε = {args.epsilon:g} with the DP learning rate chosen on validation data",
        f"{len(args.lr_values)} rates × {args.tune_seeds} tuning seed(s) on validation data, then {args.seeds} test "
        f"seed(s); mean ± standard error over seeds, gaps paired per seed; {(time.perf_counter() - t0) / 60:.0f} min",
        c.machine_description(),
        notes=[
            f"- `configs/demo-llm.yaml` at size `{args.size}` (FFA-LoRA r=8, Dirichlet label skew), all six sites in "
            f"the EU (one averaged model), {args.rounds} round(s) × 1 local epoch, batch {args.batch}, "
            f"{args.private_examples:,} private training examples, `store.base: int8`; record-level DP-SGD at "
            f"every site, ε = {args.epsilon:g}, δ = {llm.DELTA:g}, σ calibrated per site, clip {args.dp_clip:g} "
            "(local noise: the task takes many Adam steps a round, so its update is not linear in the noise and "
            "distributed noise does not apply).",
            f"- Validation: {args.validation_examples:,} private examples after the training pool, never trained on "
            f"(the task's `validation_examples`); tuning seeds {TUNE_SEED0}-{TUNE_SEED0 + args.tune_seeds - 1}. "
            f"Test: the whole test set ({test_predictions // args.seeds:,} examples), seeds 0-{args.seeds - 1}.",
            f"- Central reference: the same LoRA on the pooled training data, {args.rounds} epoch(s), Adam lr "
            f"{args.central_lr:g} (its validation pick, `bench/llm_lr_sweep.py`), fp32 base. Largest ε any site "
            f"spent: {spent:.3f} (budget {args.epsilon:g}).",
        ],
        headers=["setting", "validation accuracy % (mean ± SE)", "gap vs central pp (mean ± SE)"],
        rows=rows,
        interpretation=(
            f"The DP federation's learning rate chosen on validation data is {pick:g}; at it, on the test set, the "
            f"DP federation is {pp(*gap)} pp against the central LoRA (paired over {args.seeds} seeds; negative: "
            f"below central). Every site spent at most its budget: {'yes' if spent <= args.epsilon else 'NO'}."
        ),
        headline=headline,
        console_title=f"LLM task, DP ε={args.epsilon:g}: choosing the rate, then the test gap",
    )
    return 0


def llm_test_set(args: argparse.Namespace) -> Any:
    """The task's test set at this size."""
    from clients.tasks.llm import LlmTask

    return LlmTask(size=args.size, cache_dir=str(args.cache_dir)).splits().test


if __name__ == "__main__":
    raise SystemExit(main())
